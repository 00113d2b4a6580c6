"""posenc: positional encodings and length extrapolation."""
