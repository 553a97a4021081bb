"""Quantized weights of the linear projections: int8 weight-only and float8_e4m3fn, per-channel scales.

``model.quantization`` chooses the scheme:

- ``int8``: each output channel (row of an [out, in] weight) gets one symmetric float32 scale,
  ``amax(|row|) / 127``; the weight is stored as int8 and the activations stay in the model dtype.
  On CPU the panel GEMM widens the int8 panels inside the kernel (``ops/panel_gemm.py``), elsewhere
  torch's int8 weight GEMM or dequantize-then-matmul runs.
- ``fp8``: the same per-channel scales with ``amax / 448`` and float8_e4m3fn weights. CUDA only: on
  sm90 the step's activations are quantized per token and ``torch._scaled_mm`` multiplies the two
  fp8 operands; elsewhere the weight is dequantized and multiplied in the model dtype.

Only the linear projections are quantized (q/k/v/o, gate/up/down, the experts'): they hold nearly
all the parameters and each decode step streams them from memory once. The embedding is a lookup
(no GEMM to save), the norms are a few vectors, and the LM head's logits decide the greedy token
directly, so an error there changes answers most for the least memory: they stay in the model dtype,
as vLLM's and llm-compressor's schemes leave ``lm_head`` unquantized.

Weights are quantized at load, one projection at a time (the 16/32-bit copy of one projection is the
only transient), or read already quantized from a checkpoint in the compressed-tensors layout that
llm-compressor writes and vLLM loads: ``config.json`` carries ``quantization_config`` with
``quant_method: compressed-tensors``, and each quantized projection stores ``<name>.weight`` (int8 or
float8_e4m3fn, [out, in]) with ``<name>.weight_scale`` ([out, 1], one scale per output channel;
[1] for a per-tensor scale), or, in the ``pack-quantized`` format llm-compressor uses for int8
weight-only, ``<name>.weight_packed`` (int32, four int8 values offset by 128 per int32, little end
first) with ``<name>.weight_shape``. :func:`write_compressed_tensors` writes that layout.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from frontier_runtime.distributed import TPGroup
from frontier_runtime.ops import panel_gemm

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
INT8_MAX = 127.0
QUANTIZATIONS = ("none", "int8", "fp8")
WEIGHT_DTYPES = {"int8": torch.int8, "fp8": FP8}
# Devices each scheme runs on: float8 GEMMs (and the fp8 dtype's fast conversions) are CUDA's.
RUNS_ON = {"none": ("cpu", "cuda"), "int8": ("cpu", "cuda"), "fp8": ("cuda",)}
COMPRESSED_TENSORS = "compressed-tensors"
# compressed-tensors formats whose tensors this loader reads (each stores per-channel scales).
DENSE_WEIGHT_FORMATS = ("int-quantized", "naive-quantized", "float-quantized")
PACKED_FORMAT = "pack-quantized"


class QuantizationError(ValueError):
    """A quantization the device cannot run, or a checkpoint whose scheme disagrees with the setting."""


@dataclass(frozen=True)
class QuantizedWeight:
    """One projection's weight: ``qweight`` [out, in] (int8 or float8_e4m3fn), ``scale`` [out] float32."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.qweight, self.scale, dtype)


def quantize(weight: torch.Tensor, quantization: str) -> QuantizedWeight:
    """``weight`` [out, in] with one symmetric scale per output channel (computed in float32)."""
    w = weight.float()
    limit = INT8_MAX if quantization == "int8" else FP8_MAX
    # An all-zero row keeps scale 1 (any scale gives zeros; 0 would divide by zero).
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / limit, torch.ones_like(amax))
    scaled = w / scale[:, None]
    if quantization == "int8":
        q = scaled.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    else:
        q = scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return QuantizedWeight(q, scale)


def dequantize(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The [out, in] weight ``qweight * scale`` (per row), computed in float32, returned in ``dtype``."""
    return (qweight.float() * scale.float()[:, None]).to(dtype)


def device_problem(quantization: str, device: str) -> str:
    """Why ``device`` cannot run ``quantization`` ("" if it can), naming what it can run."""
    if quantization not in RUNS_ON:
        return f"model.quantization {quantization!r} is not one of {list(QUANTIZATIONS)}"
    if device in RUNS_ON[quantization]:
        return ""
    can = [name for name, devices in RUNS_ON.items() if device in devices]
    return (
        f"model.quantization {quantization!r} needs a CUDA GPU (float8_e4m3fn weights), and this runtime's "
        f"device is {device!r}, which runs model.quantization {' or '.join(repr(c) for c in can)}"
    )


# ---- the checkpoint's own quantization (compressed-tensors) ----------------------------------------


@dataclass(frozen=True)
class StoredScheme:
    """How a compressed-tensors checkpoint stores its quantized projections."""

    quantization: str  # "int8" or "fp8"
    format: str  # a compressed-tensors format: the tensors each projection stores


def checkpoint_scheme(model_dir: Path, quantization: str) -> StoredScheme | None:
    """The checkpoint's stored scheme (None for an unquantized one), refused where it is not one this
    loader reads or disagrees with ``quantization``: before any weight is read."""
    where = f"{model_dir}/config.json quantization_config"
    try:
        qc = json.loads((model_dir / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError):
        return None  # config.json's own errors are LlamaConfig's to report
    if not qc:
        return None
    method = qc.get("quant_method")
    if method != COMPRESSED_TENSORS:
        raise QuantizationError(
            f"{where}: quant_method {method!r} is not loaded (only {COMPRESSED_TENSORS!r} checkpoints with "
            f"int8 or fp8 per-channel weights are); model.quantization is {quantization!r}"
        )
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise QuantizationError(
            f"{where}: config_groups has {len(groups)} groups ({sorted(groups)}); only one scheme for every "
            "quantized projection is loaded"
        )
    name, group = next(iter(groups.items()))
    stored = _stored_scheme(f"{where}.config_groups.{name}", group, group.get("format") or qc.get("format"))
    if stored.quantization != quantization:
        raise QuantizationError(
            f"{where} stores {stored.quantization} weights ({COMPRESSED_TENSORS}, format {stored.format!r}), "
            f"but model.quantization is {quantization!r}: set model.quantization to {stored.quantization!r}, "
            "or point weights_uri at an unquantized checkpoint"
        )
    return stored


def _stored_scheme(where: str, group: dict[str, Any], fmt: str | None) -> StoredScheme:
    weights = group.get("weights") or {}
    kind, bits = weights.get("type"), weights.get("num_bits")
    strategy, symmetric = weights.get("strategy"), weights.get("symmetric", True)
    schemes: dict[tuple[Any, Any], str] = {("int", 8): "int8", ("float", 8): "fp8"}
    quantization = schemes.get((kind, bits))
    if quantization is None:
        raise QuantizationError(
            f"{where}.weights: type {kind!r} num_bits {bits!r} is not loaded (int 8 or float 8 only)"
        )
    if strategy not in ("channel", "tensor") or weights.get("group_size") or not symmetric:
        raise QuantizationError(
            f"{where}.weights: strategy {strategy!r} group_size {weights.get('group_size')!r} symmetric "
            f"{symmetric!r} is not loaded (symmetric 'channel' or 'tensor' scales only)"
        )
    activations = group.get("input_activations")
    # Dynamic activation scales need nothing stored: the weights load the same (int8 runs weight-only,
    # fp8 quantizes activations per token on CUDA). Static ones would need calibrated input_scale tensors.
    if activations and not activations.get("dynamic", False):
        raise QuantizationError(
            f"{where}.input_activations: static activation scales are not loaded (dynamic or none only)"
        )
    packed = quantization == "int8" and fmt == PACKED_FORMAT
    if fmt not in DENSE_WEIGHT_FORMATS and not packed:
        raise QuantizationError(
            f"{where}: format {fmt!r} is not loaded for {quantization} weights (one of "
            f"{[*DENSE_WEIGHT_FORMATS, PACKED_FORMAT + ' (int8)']})"
        )
    return StoredScheme(quantization, str(fmt))


# ---- filling the model's projections ------------------------------------------------------------


class Projection(Protocol):
    """A linear layer that takes a quantized weight (``layers.Linear``, which imports this module)."""

    out_features: int
    in_features: int

    def adopt_quantized(self, qweight: torch.Tensor, scale: torch.Tensor, quantization: str) -> None: ...


class WeightSource(Protocol):
    """The checkpoint's tensors (``loader.Checkpoint``, which imports this module)."""

    model_dir: Path

    def __contains__(self, name: object) -> bool: ...

    def read(self, name: str, tp: TPGroup = ..., dim: int | None = None) -> torch.Tensor: ...

    def shape(self, name: str) -> tuple[int, ...]: ...


class WeightQuantizer:
    """Fills each linear projection with its quantized weight: read quantized from the checkpoint
    where it stores one, else quantized here from the checkpoint's 16/32-bit weight, one projection
    at a time, sliced for this rank like the unquantized weight (rows of a column-parallel
    projection with their scales; columns of a row-parallel one, whose scales stay whole)."""

    def __init__(
        self, quantization: str, ckpt: WeightSource, stored: StoredScheme | None, device: torch.device
    ) -> None:
        self.quantization, self.ckpt, self.stored, self.device = quantization, ckpt, stored, device

    @staticmethod
    def covers(what: str) -> bool:
        """Whether the projection ``what`` is quantized: every linear one but the LM head (see above)."""
        return what != "lm_head"

    def fill(
        self, module: Projection, what: str, pieces: list[tuple[str, int | None]], shards: TPGroup
    ) -> None:
        parts = [self._piece(name, dim, shards) for name, dim in pieces]
        qweight = torch.cat([p.qweight for p in parts]) if len(parts) > 1 else parts[0].qweight
        scale = torch.cat([p.scale for p in parts]) if len(parts) > 1 else parts[0].scale
        out_features, in_features = module.out_features, module.in_features
        if tuple(qweight.shape) != (out_features, in_features):
            raise ValueError(
                f"{self.ckpt.model_dir}: {what} gets a {self.quantization} weight of shape "
                f"{tuple(qweight.shape)} (this rank's slice), expected ({out_features}, {in_features})"
            )
        module.adopt_quantized(qweight.to(self.device), scale.to(self.device), self.quantization)

    def _quantized_here(self, name: str, dim: int | None, shards: TPGroup) -> QuantizedWeight:
        """A projection stored unquantized, quantized for this rank.

        A column-parallel slice (whole rows) is quantized alone. A row-parallel one is not: its
        row's scale is the amax of the whole row, as a pre-quantized checkpoint stores it and as
        one rank computes it, so the whole projection is read (the one transient copy), quantized,
        and this rank keeps its columns: every tensor-parallel size multiplies by the same weights."""
        # Quantized on the serving device (a GPU does it in a blink): the float copy of this one
        # projection is the only transient there.
        if dim != 1 or shards.world_size == 1:
            return quantize(self.ckpt.read(name, shards, dim).to(self.device), self.quantization)
        size = self.ckpt.shape(name)[1]
        if size % shards.world_size:
            raise ValueError(
                f"{self.ckpt.model_dir}: {name} dimension 1 of size {size} does not split over "
                f"{shards.world_size} ranks"
            )
        return _row_slice(quantize(self.ckpt.read(name).to(self.device), self.quantization), shards)

    def _piece(self, name: str, dim: int | None, shards: TPGroup) -> QuantizedWeight:
        base = name.removesuffix(".weight")
        if base + ".weight_scale" not in self.ckpt:
            return self._quantized_here(name, dim, shards)
        if self.stored is None:
            raise ValueError(
                f"{self.ckpt.model_dir}: {base}.weight_scale is stored but config.json has no "
                "quantization_config naming the scheme"
            )
        if base + ".weight_packed" in self.ckpt:
            packed = self.ckpt.read(base + ".weight_packed", shards, dim)
            columns = int(self.ckpt.read(base + ".weight_shape")[1])
            if dim == 1:
                columns //= shards.world_size
            qweight = unpack_int8(packed)[:, :columns]  # less the padding of the last int32
        else:
            qweight = self.ckpt.read(name, shards, dim)
        want = WEIGHT_DTYPES[self.quantization]
        if qweight.dtype != want:
            raise ValueError(
                f"{self.ckpt.model_dir}: {name} is stored as {qweight.dtype}, but the checkpoint's "
                f"quantization_config says {self.quantization} ({want})"
            )
        scale_name = base + ".weight_scale"
        # A per-channel scale [out, 1] follows the rows of its weight; a per-tensor one serves every row.
        stored_shape = self.ckpt.shape(scale_name)
        per_channel = bool(stored_shape) and stored_shape[0] > 1
        scale = self.ckpt.read(scale_name, shards, dim if per_channel and dim == 0 else None)
        scale = scale.float().reshape(-1)
        if not per_channel:
            scale = scale.expand(qweight.shape[0]).contiguous()
        return QuantizedWeight(qweight, scale)


def _row_slice(q: QuantizedWeight, shards: TPGroup) -> QuantizedWeight:
    """This rank's columns of a row-parallel weight; the scales stay whole (one per output row)."""
    part = q.qweight.shape[1] // shards.world_size
    columns = q.qweight[:, shards.rank * part : (shards.rank + 1) * part]
    return QuantizedWeight(columns.contiguous(), q.scale)


def unpack_int8(packed: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' ``pack-quantized`` 8-bit weight: int32 [out, in / 4], each holding four
    values + 128 from its lowest byte up, i.e. the unsigned bytes in order on a little-endian host."""
    as_bytes = packed.contiguous().view(torch.uint8).reshape(packed.shape[0], -1)
    return (as_bytes.to(torch.int16) - 128).to(torch.int8)


def pack_int8(qweight: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`unpack_int8` (``in`` padded with zeros to a multiple of 4)."""
    rows, cols = qweight.shape
    pad = -cols % 4
    unsigned = (qweight.to(torch.int16) + 128).to(torch.uint8)
    if pad:
        unsigned = torch.cat([unsigned, unsigned.new_zeros((rows, pad))], dim=1)
    return unsigned.contiguous().view(torch.int32)


# ---- the forward pass -------------------------------------------------------------------------


def linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    panels: bool,
) -> torch.Tensor:
    """``x @ (qweight * scale).T + bias`` in x's dtype, by the fastest path the device has.

    ``panels``: ``qweight`` is int8 packed for the CPU panel GEMM (float32 inside the kernel)."""
    if panels:
        x32 = x.float()
        bias32 = None if bias is None else bias.float()
        out = panel_gemm.linear_int8(x32, qweight, scale, bias32)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
    if qweight.dtype == FP8 and scaled_mm_applies(x, qweight):
        return fp8_scaled_mm(x, qweight, scale, bias)
    if qweight.dtype == torch.int8 and x.device.type == "cpu" and x.dtype != torch.float32:
        # torch's int8 weight GEMM (one scale per output channel, in x's dtype). Not for float32
        # activations: its float32 kernel is ~30x slower than this at 128 rows (measured here).
        rows = x.reshape(-1, x.shape[-1])
        out = torch._weight_int8pack_mm(rows.contiguous(), qweight, scale.to(x.dtype))
        out = out.view(*x.shape[:-1], qweight.shape[0])
        return out if bias is None else out + bias
    # Dequantize, then multiply: int8 and e4m3 values are exact in bfloat16, float16 and float32,
    # so the weight converts exactly and its per-channel scale multiplies the output, in float32.
    out = (F.linear(x, qweight.to(x.dtype)).float() * scale).to(x.dtype)
    return out if bias is None else out + bias


def scaled_mm_applies(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """Whether ``torch._scaled_mm`` multiplies these operands: a CUDA sm90+ device (row-wise scales),
    bfloat16 activations, and both GEMM dimensions multiples of 16."""
    if not x.is_cuda or x.dtype != torch.bfloat16:
        return False
    n, k = qweight.shape
    return torch.cuda.get_device_capability(x.device) >= (9, 0) and n % 16 == 0 and k % 16 == 0


def quantize_rows_fp8(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [tokens, K] as float8_e4m3fn with one float32 scale per token ([tokens, 1])."""
    amax = rows.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (rows.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_scaled_mm(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """fp8 x fp8 on the tensor cores: activations quantized per token, weights per channel, the
    product rescaled by both in the GEMM's epilogue."""
    rows = x.reshape(-1, x.shape[-1])
    x8, x_scale = quantize_rows_fp8(rows)
    # qweight.t() is the column-major [K, N] operand _scaled_mm wants for its second argument.
    out = torch._scaled_mm(x8, qweight.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype)
    out = out.view(*x.shape[:-1], qweight.shape[0])
    return out if bias is None else out + bias


# ---- measuring and writing ----------------------------------------------------------------------


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every tensor the model holds: parameters, buffers and the CPU layouts a linear layer
    keeps outside them (its packed or transposed weight), each storage counted once."""
    seen: dict[int, int] = {}
    for module in model.modules():
        tensors: Iterable[torch.Tensor | None] = [
            *module.parameters(recurse=False),
            *module.buffers(recurse=False),
            getattr(module, "packed", None),
            getattr(module, "weight_t", None),
        ]
        for t in tensors:
            if isinstance(t, torch.Tensor) and not t.is_meta and t.layout == torch.strided:
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
            elif isinstance(t, torch.Tensor) and not t.is_meta:  # oneDNN's opaque packed tensor
                seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


# The projections of a Llama-family checkpoint that are quantized (the LM head and the MoE router
# are not; see the module's docstring).
PROJECTIONS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "w1",
    "w2",
    "w3",
)


def is_projection(name: str) -> bool:
    parts = name.split(".")
    return name.startswith("model.layers.") and parts[-1] == "weight" and parts[-2] in PROJECTIONS


def write_compressed_tensors(
    src: str | Path, dst: str | Path, quantization: str, packed: bool = True
) -> Path:
    """Write ``src``'s unquantized checkpoint to ``dst`` as a compressed-tensors checkpoint of
    ``quantization`` (per-channel scales, float32), every other file copied.

    int8 is written as llm-compressor writes weight-only int8 (``pack-quantized``) unless ``packed``
    is false (``int-quantized``: a plain int8 ``weight``); fp8 as ``float-quantized``."""
    src, dst = Path(src), Path(dst)
    if quantization not in WEIGHT_DTYPES:
        raise QuantizationError(f"quantization {quantization!r}: expected one of {sorted(WEIGHT_DTYPES)}")
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "model.safetensors.index.json":
            shutil.copy2(path, dst / path.name)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                value = f.get_tensor(name)
                if not is_projection(name):
                    tensors[name] = value
                    continue
                q = quantize(value, quantization)
                base = name.removesuffix(".weight")
                tensors[base + ".weight_scale"] = q.scale.view(-1, 1)
                if quantization == "int8" and packed:
                    tensors[base + ".weight_packed"] = pack_int8(q.qweight)
                    tensors[base + ".weight_shape"] = torch.tensor(q.qweight.shape, dtype=torch.int32)
                else:
                    tensors[base + ".weight"] = q.qweight
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = compressed_tensors_config(quantization, packed)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dst


def compressed_tensors_config(quantization: str, packed: bool = True) -> dict[str, Any]:
    """``quantization_config`` of a weight-only per-channel scheme, as compressed-tensors spells it."""
    kind = "int" if quantization == "int8" else "float"
    fmt = (PACKED_FORMAT if packed else "int-quantized") if quantization == "int8" else "float-quantized"
    return {
        "quant_method": COMPRESSED_TENSORS,
        "format": fmt,
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": kind,
                    "strategy": "channel",
                    "symmetric": True,
                    "group_size": None,
                    "dynamic": False,
                    "observer": "minmax",
                },
                "input_activations": None,
                "output_activations": None,
            }
        },
    }


@dataclass(frozen=True)
class Agreement:
    """How far two runs' greedy outputs agree: whole outputs and token by token."""

    prompts: int
    identical: int  # prompts whose outputs are identical
    tokens: int
    same_tokens: int  # positions where both runs chose the same token

    @property
    def prompt_fraction(self) -> float:
        return self.identical / self.prompts

    @property
    def token_fraction(self) -> float:
        return self.same_tokens / self.tokens


def agreement(reference: list[list[int]], other: list[list[int]]) -> Agreement:
    """Agreement of ``other`` with ``reference`` (outputs of the same prompts, in order)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference outputs against {len(other)}")
    same = sum(
        a == b for ref, out in zip(reference, other, strict=True) for a, b in zip(ref, out, strict=False)
    )
    return Agreement(
        prompts=len(reference),
        identical=sum(ref == out for ref, out in zip(reference, other, strict=True)),
        tokens=sum(len(ref) for ref in reference),
        same_tokens=same,
    )
