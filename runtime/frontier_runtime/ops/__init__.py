"""Attention over the paged KV cache: the kernels each device gets, and how they are built.

``paged_attention`` is the one entry point the model calls per layer; ``cpu_kernel`` loads the CPU
kernels ``build_kernels`` built ahead of time (never compiling while serving); ``triton_attention``
is the GPU's paged kernel. Imports nothing else from the runtime, so models and engine can both use it.
"""
