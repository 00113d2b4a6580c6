"""Text and tokens: the corpora and their deterministic split (``corpora``, installed by ``corpus_install``),
tokenizers (``tokenizer``), the cached token arrays of a corpus (``prepare``) and the training batches and
evaluation windows over them (``batches``)."""
