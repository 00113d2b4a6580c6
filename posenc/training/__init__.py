"""Training a TinyLM: the loop and its configuration (``train``), and the training-time position methods, PoSE
and randomized positions (``positions``) and S^2-attention (``s2``)."""
