"""What runs where: every attention backend and weight quantization, the devices it runs on and the
dtypes it reads, as plain data.

Nothing here imports torch, so the toolkit's stack check reads these same entries and refuses a
stack whose hosts could not run what it asks for before any host is touched. The runtime's classes
(``ops.attention``'s backends, ``models.llama.quant``'s methods) take their facts from here and add
the behaviour; each name is spelled once, in this module.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU = "cpu"
CUDA = "cuda"
DEVICES = (CPU, CUDA)

# What a backend or method restricted to one device says of itself where it is asked for elsewhere.
DEVICE_NEEDS = {CUDA: "needs a GPU", CPU: "runs on CPU hosts only"}

FLOATS = ("float32", "bfloat16", "float16")
FP8 = "fp8"  # float8_e4m3fn, as ``runtime.kv_cache_dtype`` names it

# A cache's axes, outermost first: FlashAttention's paged layout, which every backend but the CPU
# kernel reads.
FLASH_LAYOUT = ("blocks", "block_size", "kv_heads", "head_dim")


@dataclass(frozen=True)
class AttentionTraits:
    """One attention backend's static facts (its behaviour is its class in ``ops.attention``)."""

    name: str
    devices: tuple[str, ...]  # device types it serves on
    dtypes: tuple[str, ...]  # model dtypes it computes in
    kv_dtypes: tuple[str, ...]  # KV cache dtypes it reads
    k_layout: tuple[str, ...]  # the K cache's axes
    v_layout: tuple[str, ...]
    # A step reads tensors only (no host copies of lengths), so a decode step can be captured in a
    # CUDA graph and replayed with new lengths and block tables.
    graph_capturable: bool

    def problem(self, device: str, kv_dtype: str | None = None) -> str:
        """Why it cannot serve on ``device`` with a ``kv_dtype`` cache ("" if it can)."""
        if device not in self.devices:
            if len(self.devices) == 1:
                return DEVICE_NEEDS[self.devices[0]]
            return f"runs on {' and '.join(self.devices)} only"
        if kv_dtype is not None and kv_dtype not in self.kv_dtypes:
            return f"reads no {kv_dtype} KV cache"
        return ""


# Fastest first: ``auto`` takes the first one that runs on the device.
ATTENTION_BACKENDS = {
    t.name: t
    for t in (
        # The C++ kernel of ``ops.cpu_kernel``; K laid out so a query's scores against a block are
        # head_dim vector multiply-adds.
        AttentionTraits(
            name="cpu-kernel",
            devices=(CPU,),
            dtypes=FLOATS,
            kv_dtypes=(*FLOATS, FP8),
            k_layout=("blocks", "kv_heads", "head_dim", "block_size"),
            v_layout=("blocks", "kv_heads", "block_size", "head_dim"),
            graph_capturable=True,
        ),
        # FlashAttention's paged varlen kernel through torch's ``varlen_attn``: 16-bit only.
        AttentionTraits(
            name="flash-varlen",
            devices=(CUDA,),
            dtypes=("bfloat16", "float16"),
            kv_dtypes=("bfloat16", "float16"),
            k_layout=FLASH_LAYOUT,
            v_layout=FLASH_LAYOUT,
            graph_capturable=True,
        ),
        # The Triton kernel of ``ops.triton_attention``.
        AttentionTraits(
            name="triton",
            devices=(CUDA,),
            dtypes=FLOATS,
            kv_dtypes=(*FLOATS, FP8),
            k_layout=FLASH_LAYOUT,
            v_layout=FLASH_LAYOUT,
            graph_capturable=True,
        ),
        # The portable path: gathered blocks, one SDPA call per kind of sequence; pads from host
        # copies of the lengths, which a captured graph would freeze.
        AttentionTraits(
            name="sdpa-gather",
            devices=DEVICES,
            dtypes=FLOATS,
            kv_dtypes=(*FLOATS, FP8),
            k_layout=FLASH_LAYOUT,
            v_layout=FLASH_LAYOUT,
            graph_capturable=False,
        ),
    )
}
AUTO = "auto"  # the ``attention_backend`` setting that leaves the choice to the host


def attention_backends_on(device: str, kv_dtype: str | None = None) -> tuple[str, ...]:
    """The backends that serve on ``device`` (with a ``kv_dtype`` cache), fastest first."""
    return tuple(name for name, t in ATTENTION_BACKENDS.items() if not t.problem(device, kv_dtype))


@dataclass(frozen=True)
class QuantizationTraits:
    """One weight quantization's static facts (its behaviour is its class in ``models.llama.quant``)."""

    name: str
    devices: tuple[str, ...]  # device types that run its GEMMs
    weights: str  # the dtype a quantized projection's weight is stored in ("" for none)
    # Bytes a projection's weight takes per parameter (0: the model's dtype decides); the per-output-
    # channel float32 scales come on top.
    weight_bytes: int = 0

    @property
    def quantized(self) -> bool:
        return self.weight_bytes > 0

    def problem(self, device: str) -> str:
        """Why ``device`` cannot run it ("" if it can)."""
        if device in self.devices:
            return ""
        where = "a CUDA GPU" if CUDA in self.devices else " or ".join(self.devices)
        return f"needs {where} ({self.weights} weights)"


UNQUANTIZED = "none"  # the ``model.quantization`` that keeps the checkpoint's dtype

QUANTIZATIONS = {
    t.name: t
    for t in (
        QuantizationTraits(name=UNQUANTIZED, devices=DEVICES, weights=""),
        # Weight-only: activations stay in the model dtype, so any device multiplies.
        QuantizationTraits(name="int8", devices=DEVICES, weights="int8", weight_bytes=1),
        # float8 GEMMs (and the fp8 dtype's fast conversions) are CUDA's.
        QuantizationTraits(name="fp8", devices=(CUDA,), weights="float8_e4m3fn", weight_bytes=1),
    )
}


def quantizations_on(device: str) -> tuple[str, ...]:
    """The quantizations ``device`` runs."""
    return tuple(name for name, t in QUANTIZATIONS.items() if not t.problem(device))
