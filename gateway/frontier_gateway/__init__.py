"""Frontier's gateway: the access layer in front of the model pools (its own distribution)."""

__version__ = "0.1.0"
