"""Frontier: provision and operate clusters that serve large language models."""

__version__ = "0.1.0"
