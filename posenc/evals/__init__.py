"""The evaluation harnesses and what they share: the lab's bench (``lab``: train short, test long), the
long-context suite on pretrained models (``suite``), a pretrained model's perplexity and pass keys
(``pretrained``), DuoAttention's calibration (``calibrate``), ``posenc tune`` (``tune``), the records every harness
writes (``records``), their statistics (``stats``) and reports (``report``)."""
