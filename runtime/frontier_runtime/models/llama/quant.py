"""Quantized weights of the linear projections: int8 weight-only and float8_e4m3fn, per-channel scales.

``model.quantization`` chooses the scheme:

- ``int8``: each output channel (row of an [out, in] weight) gets one symmetric float32 scale,
  ``amax(|row|) / 127``; the weight is stored as int8 and the activations stay in the model dtype.
  On CPU the panel GEMM widens the int8 panels inside the kernel (``ops/panel_gemm.py``); on CUDA a
  decode step's few rows go through a Triton kernel that widens each weight tile in registers
  (``triton_fused.weight_only_linear``); elsewhere torch's int8 weight GEMM or dequantize-then-matmul.
- ``fp8``: the same per-channel scales with ``amax / 448`` and float8_e4m3fn weights. CUDA only: a decode
  step's few rows through the same Triton kernel as int8; more rows on sm90 have their activations
  quantized per token and ``torch._scaled_mm`` multiplies the two fp8 operands; elsewhere the weight
  is dequantized and multiplied in the model dtype.

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
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from frontier_runtime.distributed import TPGroup
from frontier_runtime.ops import panel_gemm, table, triton_fused

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
INT8_MAX = 127.0
COMPRESSED_TENSORS = "compressed-tensors"
# compressed-tensors formats whose tensors this loader reads (each stores per-channel scales).
DENSE_WEIGHT_FORMATS = ("int-quantized", "naive-quantized", "float-quantized")
PACKED_FORMAT = "pack-quantized"
# torch's CPU int8 weight GEMM (``torch._weight_int8pack_mm``) reads the inputs 16 at a time and
# crashes the process (SIGSEGV, torch 2.13) on any other width: narrower layers take the dequantized path.
INT8PACK_WIDTH_MULTIPLE = 16


class QuantizationError(ValueError):
    """A quantization the device cannot run, or a checkpoint whose scheme disagrees with the setting."""


class QuantizationMethod:
    """One ``model.quantization``: where it runs (its ``ops.table`` traits), how a weight is
    quantized and multiplied, and how compressed-tensors spells it. A class, never instantiated."""

    traits: ClassVar[table.QuantizationTraits]
    name: ClassVar[str]
    weight_dtype: ClassVar[torch.dtype | None] = None  # None: the projections stay in the model dtype
    limit: ClassVar[float] = 0.0  # the largest magnitude a quantized weight holds
    # compressed-tensors' ``weights.type`` and the format of its plain (unpacked) weights.
    stored_type: ClassVar[str] = ""
    dense_format: ClassVar[str] = ""
    packs: ClassVar[bool] = False  # may also be stored pack-quantized (four values per int32)

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.name = cls.traits.name

    @classmethod
    def quantizes(cls) -> bool:
        return cls.weight_dtype is not None

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> QuantizedWeight:
        """``weight`` [out, in] with one symmetric scale per output channel (computed in float32)."""
        if cls.weight_dtype is None:
            raise QuantizationError(f"model.quantization {cls.name!r} quantizes no weight")
        w = weight.float()
        scale = symmetric_scale(w.abs().amax(dim=1), cls.limit)
        return QuantizedWeight(cls.cast(w / scale[:, None]), scale)

    @classmethod
    def cast(cls, scaled: torch.Tensor) -> torch.Tensor:
        """Scaled float32 weights (within ``limit``) as ``weight_dtype``."""
        raise NotImplementedError(f"{cls.__name__} stores no quantized weight")

    @classmethod
    def uses_panels(cls, device: torch.device) -> bool:
        """Whether a weight on ``device`` is packed for the CPU panel GEMM."""
        return False

    @classmethod
    def linear(cls, x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None, panels: bool) -> Tensor:
        """``x @ (qweight * scale).T + bias`` in x's dtype: dequantize, then multiply. int8 and e4m3
        values are exact in bfloat16, float16 and float32, so the weight converts exactly and its
        per-channel scale multiplies the output, in float32."""
        out = (F.linear(x, qweight.to(x.dtype)).float() * scale).to(x.dtype)
        return out if bias is None else out + bias


class Unquantized(QuantizationMethod):
    traits = table.QUANTIZATIONS[table.UNQUANTIZED]


class Int8(QuantizationMethod):
    """Weight-only int8: activations stay in the model dtype."""

    traits = table.QUANTIZATIONS["int8"]
    weight_dtype = torch.int8
    limit = INT8_MAX
    stored_type = "int"
    dense_format = "int-quantized"
    packs = True

    @classmethod
    def cast(cls, scaled: torch.Tensor) -> torch.Tensor:
        return scaled.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)

    @classmethod
    def uses_panels(cls, device: torch.device) -> bool:
        return device.type == "cpu" and panel_gemm.available()

    @classmethod
    def linear(cls, x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None, panels: bool) -> Tensor:
        """``panels``: ``qweight`` is packed for the CPU panel GEMM, which widens it inside the
        kernel (float32 there)."""
        if panels:
            x32 = x.float()
            bias32 = None if bias is None else bias.float()
            out = panel_gemm.linear_int8(x32, qweight, scale, bias32)
            return out if x.dtype == torch.float32 else out.to(x.dtype)
        if triton_fused.weight_only_applies(x, qweight):
            return triton_fused.weight_only_linear(x, qweight, scale, bias)
        if x.device.type == "cpu" and x.dtype != torch.float32 and x.shape[-1] % INT8PACK_WIDTH_MULTIPLE == 0:
            # torch's int8 weight GEMM (one scale per output channel, in x's dtype). Not for float32
            # activations: its float32 kernel is ~30x slower than this at 128 rows (measured here).
            rows = x.reshape(-1, x.shape[-1])
            out = torch._weight_int8pack_mm(rows.contiguous(), qweight, scale.to(x.dtype))
            out = out.view(*x.shape[:-1], qweight.shape[0])
            return out if bias is None else out + bias
        return super().linear(x, qweight, scale, bias, panels)


class Fp8(QuantizationMethod):
    """float8_e4m3fn weights; on sm90 the activations are quantized per token too."""

    traits = table.QUANTIZATIONS["fp8"]
    weight_dtype = FP8
    limit = FP8_MAX
    stored_type = "float"
    dense_format = "float-quantized"

    @classmethod
    def cast(cls, scaled: torch.Tensor) -> torch.Tensor:
        return scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8)

    @classmethod
    def linear(cls, x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None, panels: bool) -> Tensor:
        """A decode step's few rows: the weight widened in registers (no activation to quantize);
        more rows on sm90: both operands fp8 through ``torch._scaled_mm``."""
        if triton_fused.weight_only_applies(x, qweight):
            return triton_fused.weight_only_linear(x, qweight, scale, bias)
        if scaled_mm_applies(x, qweight):
            return fp8_scaled_mm(x, qweight, scale, bias)
        return super().linear(x, qweight, scale, bias, panels)


METHODS: dict[str, type[QuantizationMethod]] = {cls.name: cls for cls in (Unquantized, Int8, Fp8)}


def method(quantization: str) -> type[QuantizationMethod]:
    """The method registered as ``quantization``, or QuantizationError listing those there are."""
    try:
        return METHODS[quantization]
    except KeyError:
        raise QuantizationError(
            f"model.quantization {quantization!r} is not one of {list(METHODS)}"
        ) from None


@dataclass(frozen=True)
class QuantizedWeight:
    """One projection's weight: ``qweight`` [out, in] (int8 or float8_e4m3fn), ``scale`` [out] float32."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.qweight, self.scale, dtype)


def quantize(weight: torch.Tensor, quantization: str) -> QuantizedWeight:
    """``weight`` [out, in] under the method named ``quantization`` (see ``QuantizationMethod.quantize``)."""
    return method(quantization).quantize(weight)


def symmetric_scale(amax: torch.Tensor, limit: float) -> torch.Tensor:
    """The symmetric scale that maps ``amax`` to ``limit``; 1 where ``amax`` is 0 (any scale gives
    zeros there, and 0 would divide by zero)."""
    return torch.where(amax > 0, amax / limit, torch.ones_like(amax))


def dequantize(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The [out, in] weight ``qweight * scale`` (per row), computed in float32, returned in ``dtype``."""
    return (qweight.float() * scale.float()[:, None]).to(dtype)


def device_problem(quantization: str, device: str) -> str:
    """Why ``device`` cannot run ``quantization`` ("" if it can), naming what it can run."""
    if quantization not in METHODS:
        return f"model.quantization {quantization!r} is not one of {list(METHODS)}"
    problem = METHODS[quantization].traits.problem(device)
    if not problem:
        return ""
    can = " or ".join(repr(name) for name in table.quantizations_on(device))
    return (
        f"model.quantization {quantization!r} {problem}, and this runtime's device is {device!r}, "
        f"which runs model.quantization {can}"
    )


# ---- the checkpoint's own quantization (compressed-tensors) ----------------------------------------


@dataclass(frozen=True)
class StoredScheme:
    """How a compressed-tensors checkpoint stores its quantized projections."""

    method: type[QuantizationMethod]
    format: str  # a compressed-tensors format: the tensors each projection stores


def checkpoint_scheme(model_dir: Path, quantization: type[QuantizationMethod]) -> StoredScheme | None:
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
            f"int8 or fp8 per-channel weights are); model.quantization is {quantization.name!r}"
        )
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise QuantizationError(
            f"{where}: config_groups has {len(groups)} groups ({sorted(groups)}); only one scheme for every "
            "quantized projection is loaded"
        )
    name, group = next(iter(groups.items()))
    stored = _stored_scheme(f"{where}.config_groups.{name}", group, group.get("format") or qc.get("format"))
    if stored.method is not quantization:
        stored_name = stored.method.name
        raise QuantizationError(
            f"{where} stores {stored_name} weights ({COMPRESSED_TENSORS}, format {stored.format!r}), "
            f"but model.quantization is {quantization.name!r}: set model.quantization to {stored_name!r}, "
            "or point weights_uri at an unquantized checkpoint"
        )
    return stored


def _stored_scheme(where: str, group: dict[str, Any], fmt: str | None) -> StoredScheme:
    weights = group.get("weights") or {}
    kind, bits = weights.get("type"), weights.get("num_bits")
    strategy, symmetric = weights.get("strategy"), weights.get("symmetric", True)
    schemes: dict[tuple[Any, Any], type[QuantizationMethod]] = {
        (m.stored_type, m.weight_dtype.itemsize * 8): m
        for m in METHODS.values()
        if m.weight_dtype is not None
    }
    stored = schemes.get((kind, bits))
    if stored is None:
        known = " or ".join(f"{t} {b}" for t, b in schemes)
        raise QuantizationError(
            f"{where}.weights: type {kind!r} num_bits {bits!r} is not loaded ({known} only)"
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
    packed = stored.packs and fmt == PACKED_FORMAT
    if fmt not in DENSE_WEIGHT_FORMATS and not packed:
        packers = ", ".join(m.name for m in METHODS.values() if m.packs)
        raise QuantizationError(
            f"{where}: format {fmt!r} is not loaded for {stored.name} weights (one of "
            f"{[*DENSE_WEIGHT_FORMATS, f'{PACKED_FORMAT} ({packers})']})"
        )
    return StoredScheme(stored, str(fmt))


# ---- filling the model's projections ------------------------------------------------------------


class Projection(Protocol):
    """A linear layer that takes a quantized weight (``layers.Linear``, which imports this module)."""

    out_features: int
    in_features: int

    def adopt_quantized(
        self, qweight: torch.Tensor, scale: torch.Tensor, method: type[QuantizationMethod]
    ) -> None: ...


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
        self,
        method: type[QuantizationMethod],
        ckpt: WeightSource,
        stored: StoredScheme | None,
        device: torch.device,
    ) -> None:
        self.method, self.ckpt, self.stored, self.device = method, ckpt, stored, device

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
                f"{self.ckpt.model_dir}: {what} gets a {self.method.name} weight of shape "
                f"{tuple(qweight.shape)} (this rank's slice), expected ({out_features}, {in_features})"
            )
        module.adopt_quantized(qweight.to(self.device), scale.to(self.device), self.method)

    def _quantized_here(self, name: str, dim: int | None, shards: TPGroup) -> QuantizedWeight:
        """A projection stored unquantized, quantized for this rank.

        A column-parallel slice (whole rows) is quantized alone. A row-parallel one is not: its
        row's scale is the amax of the whole row, as a pre-quantized checkpoint stores it and as
        one rank computes it, so the whole projection is read (the one transient copy), quantized,
        and this rank keeps its columns: every tensor-parallel size multiplies by the same weights."""
        # Quantized on the serving device (a GPU does it in a blink): the float copy of this one
        # projection is the only transient there.
        if dim != 1 or shards.world_size == 1:
            return self.method.quantize(self.ckpt.read(name, shards, dim).to(self.device))
        size = self.ckpt.shape(name)[1]
        if size % shards.world_size:
            raise ValueError(
                f"{self.ckpt.model_dir}: {name} dimension 1 of size {size} does not split over "
                f"{shards.world_size} ranks"
            )
        return _row_slice(self.method.quantize(self.ckpt.read(name).to(self.device)), shards)

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
        want = self.method.weight_dtype
        if qweight.dtype != want:
            raise ValueError(
                f"{self.ckpt.model_dir}: {name} is stored as {qweight.dtype}, but the checkpoint's "
                f"quantization_config says {self.method.name} ({want})"
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


def scaled_mm_applies(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """Whether ``torch._scaled_mm`` multiplies these operands: a CUDA sm90+ device (row-wise scales),
    bfloat16 activations, and both GEMM dimensions multiples of 16."""
    if not x.is_cuda or x.dtype != torch.bfloat16:
        return False
    n, k = qweight.shape
    return torch.cuda.get_device_capability(x.device) >= (9, 0) and n % 16 == 0 and k % 16 == 0


def quantize_rows_fp8(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [tokens, K] as float8_e4m3fn with one float32 scale per token ([tokens, 1])."""
    scale = symmetric_scale(rows.abs().amax(dim=-1, keepdim=True).float(), FP8_MAX)
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
    quantizing = sorted(name for name, m in METHODS.items() if m.quantizes())
    if quantization not in quantizing:
        raise QuantizationError(f"quantization {quantization!r}: expected one of {quantizing}")
    chosen = METHODS[quantization]
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
                q = chosen.quantize(value)
                base = name.removesuffix(".weight")
                tensors[base + ".weight_scale"] = q.scale.view(-1, 1)
                if chosen.packs and packed:
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
    chosen = method(quantization)
    fmt = PACKED_FORMAT if packed and chosen.packs else chosen.dense_format
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
                    "type": chosen.stored_type,
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
