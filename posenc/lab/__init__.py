"""Layer 5, the lab: corpora and their split (``corpora``), tokenizers (``tokenizer``), the cached token
arrays (``data``), batches and evaluation windows (``batches``), retrieval tasks (``tasks``), metrics, training,
checkpoints, evaluation, the ``posenc bench`` job (``bench``), its records and its report."""
