"""Attention over the paged KV cache and the kernels beside it: what each device gets, and how they are built.

``attention`` holds the attention backends, one class each, and selects one per process; the model
calls the chosen one per layer through its step's metadata. ``table`` says, without torch, which
backend and which weight quantization runs where (the toolkit's stack check reads it too).
``cpu_kernel`` loads the CPU kernels ``build_kernels`` built ahead of time (never compiling while
serving); ``triton_attention`` is the GPU's paged kernel. Imports nothing else from the runtime, so
models and engine can both use it; this package itself imports nothing, so ``table`` loads without torch.
"""
