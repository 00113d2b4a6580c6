"""Statistics of the harnesses: intervals (``intervals``: Wilson, Newcombe, bootstrap), records pooled over
seeds (``pooling``) and the verdict rules (``verdict``)."""
