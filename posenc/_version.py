"""The package version, in one place (the facade and checkpoints read it)."""

__version__ = "0.1.0"
