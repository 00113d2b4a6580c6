"""Scripts that run an original implementation unchanged, in its own environment, and record its logits."""
