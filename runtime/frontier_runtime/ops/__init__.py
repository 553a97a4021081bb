"""Attention over the paged KV cache: the kernels each device gets, and how they are built.

``paged_attention`` is the one entry point the model calls per layer; ``cpu_kernel`` compiles the
CPU kernel on first use. Imports nothing else from the runtime, so models and engine can both use it.
"""
