"""Frontier's bundled inference runtime: continuous batching over a paged KV cache, served by an
OpenAI-compatible HTTP API. Runs on CPU and on CUDA. Never imports the ``frontier`` toolkit."""

__version__ = "0.1.0"
