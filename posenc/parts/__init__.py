"""Layer 1, the parts: each module is one family of position methods, written as typed torch modules and
elementwise functions of positions, with its own registry. Parts import nothing above ``posenc._util``.

``frequencies`` (RoPE frequency schedules), ``rotary`` (applying RoPE / xPos), ``absolute`` (embeddings
added to the input), ``biases`` (additive score biases), ``relative`` (Shaw / Transformer-XL / DeBERTa
score terms), ``masks`` (which keys a query sees), ``remap`` (position remaps and log-n), ``memory``
(Infini-attention's compressive memory).
"""
