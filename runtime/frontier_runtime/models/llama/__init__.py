"""The Llama family (Llama 2/3, Qwen2/Qwen3, Mistral, Mixtral, Qwen2-MoE/Qwen3-MoE), one concern
per module, gpt-fast style:

``config`` (config.json), ``layers`` (linear, norm, rotary, MLP), ``moe`` (the sparse MLP),
``attention`` (paged-KV attention and its metadata), ``model`` (the decoder), ``loader``
(safetensors into the model).
"""

from frontier_runtime.models.llama.attention import AttentionMetadata
from frontier_runtime.models.llama.config import LlamaConfig, check_tensor_parallel
from frontier_runtime.models.llama.layers import rope_inv_freq
from frontier_runtime.models.llama.loader import load_model
from frontier_runtime.models.llama.model import LlamaForCausalLM

__all__ = [
    "AttentionMetadata",
    "LlamaConfig",
    "LlamaForCausalLM",
    "check_tensor_parallel",
    "load_model",
    "rope_inv_freq",
]
