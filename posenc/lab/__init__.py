"""Layer 5, the lab: corpora and tokenizers (``data``), retrieval tasks (``tasks``), metrics, training,
checkpoints, evaluation, the ``posenc bench`` job (``bench``), its records and its report."""
