"""The engine's prepared weights: what loading computes from a checkpoint, kept so the next load skips it.

A CPU load does more than read: it fuses q/k/v and gate/up, packs every float32 projection into the
panels of the panel GEMM (or oneDNN's blocked layout), transposes or widens 16-bit weights, and
packs int8 weights. That costs a fresh allocation and a transposing copy of every byte, several
times the read. ``save_prepared`` writes the loaded model as it sits in memory — each tensor in its
final layout, every one at a 64-byte boundary, in shards of about 64 MiB — and an index
(``prepared.json``: the spec, the flags that say which layout each projection holds, the shards);
``restore_prepared`` builds the model on the meta device and points every parameter at the shards'
mapped pages: no copy, no packing, no allocation beyond the page tables. The tensors are read-only
views of the page cache (a projection's weights are never written after load), so files just
fetched into the host cache are served from the very pages the fetch wrote.

The layout depends on the runtime's code, on the CPU (which kernel variant loaded, whether the
panel GEMMs run, whether 16-bit GEMMs are native) or GPU, and on the model's dtype, quantization and
parallel placement: all of them are in the :class:`PreparedSpec` the file records, and a restore
whose spec differs from the running engine's is refused by :class:`PreparedMismatch`, naming the
field, so the caller loads the checkpoint instead. The cache in S3 that keys these files is
``frontier_runtime.storage.prepared``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

import frontier_runtime
from frontier_runtime.distributed import Placement
from frontier_runtime.models.llama import quant
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import Linear, native_half_gemm, onednn_packing, rope_tables
from frontier_runtime.models.llama.model import LlamaForCausalLM
from frontier_runtime.ops import cpu_kernel, panel_gemm

#: The index a prepared model directory holds instead of the checkpoint's: the spec, each module's
#: layout flags and the shards (``prepared-NNNNN.safetensors``) that hold the tensors.
PREPARED_NAME = "prepared.json"
SHARD_NAME = "prepared-{:05d}.safetensors"
#: Tensors are grouped into shards of about this size: the fetcher gets each with one whole-object
#: GET of at most its largest part (storage/weights.py MAX_PART_SIZE).
SHARD_BYTES = 64 * 1024 * 1024
FORMAT = "frontier-prepared/2"
#: The runtime's files whose code decides a prepared tensor's layout (hashed into the spec).
_LAYOUT_CODE = (
    "models/llama/layers.py",
    "models/llama/loader.py",
    "models/llama/quant.py",
    "models/llama/prepared.py",
    "ops/panel_gemm.py",
)
#: Every tensor's first byte is this far into the file (and so into its mapping): the widest vector load.
ALIGN = 64
_PAD = "__pad__"
_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
#: Linear attributes that say which layout its tensors are in (see layers.Linear).
_LINEAR_FLAGS = ("panels", "bf16_panels", "float_out", "widen", "qpanels")
#: Linear tensors held as plain attributes rather than parameters or buffers.
_LINEAR_TENSORS = ("packed", "weight_t")


class PreparedMismatch(ValueError):
    """A prepared file made for another runtime, device, dtype, quantization or placement."""


@dataclass(frozen=True)
class PreparedSpec:
    """Everything a prepared tensor's layout depends on, besides the weights themselves."""

    runtime: str  # the runtime's version and a digest of its layout code
    device: str  # the device kind: the CPU's kernel choices, or the GPU's name
    dtype: str
    quantization: str
    placement: str  # this rank's place: tensor, expert and pipeline parallel ranks and sizes

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def differences(self, other: PreparedSpec) -> list[str]:
        """``field: ours != theirs`` for every field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{name}: {mine[name]!r} != {theirs[name]!r}" for name in mine if mine[name] != theirs[name]]


def runtime_identity() -> str:
    """The runtime's version and a digest of the code that lays the tensors out."""
    root = Path(frontier_runtime.__file__).parent
    digest = hashlib.sha256()
    for relative in _LAYOUT_CODE:
        digest.update((root / relative).read_bytes())
    return f"{frontier_runtime.__version__}+torch{torch.__version__}+{digest.hexdigest()[:16]}"


def device_kind(device: torch.device) -> str:
    """What the loader's layout choices depend on for ``device``: on CPU the machine, the native
    kernel variant this process loaded and which GEMMs pack (so two CPUs that would lay the weights
    out alike share a kind); on CUDA the GPU's name and compute capability."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda:{torch.cuda.get_device_name(device)}:sm{major}{minor}"
    variant = (cpu_kernel.variant() or "none") if cpu_kernel.enabled() and cpu_kernel.load() else "off"
    gemms = [
        name
        for name, on in (
            ("panel", panel_gemm.available()),
            ("panel-bf16", panel_gemm.bf16_available()),
            ("onednn-packed", onednn_packing()),
            ("native-half", native_half_gemm()),
        )
        if on
    ]
    return f"cpu:{platform.machine()}:{variant}:{'+'.join(gemms) or 'plain'}"


def spec_for(
    device: torch.device, dtype: torch.dtype, quantization: str, placement: Placement
) -> PreparedSpec:
    """The spec of a model loaded on ``device`` in ``dtype`` for ``placement`` by this runtime."""
    layout = placement.layout
    where = (
        f"rank{placement.rank}:tp{placement.tp.rank}/{layout.tensor_parallel}"
        f":ep{layout.expert_parallel}:pp{layout.pipeline_parallel}"
    )
    return PreparedSpec(runtime_identity(), device_kind(device), str(dtype), quantization, where)


class PreparedUnsupported(ValueError):
    """A loaded model that cannot be written as a prepared file."""


def save_prepared(
    model: LlamaForCausalLM, directory: Path, spec: PreparedSpec, shard_bytes: int = SHARD_BYTES
) -> None:
    """Write ``model``'s tensors as loaded, and the layout of each projection, into ``directory``."""
    tensors: dict[str, torch.Tensor] = {}
    modules: dict[str, dict[str, object]] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        parameters = sorted(k for k, v in module._parameters.items() if v is not None)
        buffers = sorted(k for k, v in module._buffers.items() if v is not None)
        for attr in parameters:
            tensors[prefix + attr] = getattr(module, attr).detach()
        for attr in buffers:
            tensors[prefix + attr] = getattr(module, attr)
        entry: dict[str, object] = {"parameters": parameters, "buffers": buffers}
        if isinstance(module, Linear):
            held = [attr for attr in _LINEAR_TENSORS if getattr(module, attr) is not None]
            for attr in held:
                tensors[f"{name}#{attr}"] = getattr(module, attr)
            entry["flags"] = {flag: bool(getattr(module, flag)) for flag in _LINEAR_FLAGS}
            entry["quantized"] = module.quantization is not quant.Unquantized
            entry["tensors"] = held
        modules[name] = entry
    opaque = sorted(name for name, tensor in tensors.items() if tensor.is_mkldnn)
    if opaque:
        # oneDNN's packed weights (the CPU engine on torch ops alone) have no bytes to write.
        raise PreparedUnsupported(
            f"{opaque[0]} is held in oneDNN's opaque layout ({len(opaque)} tensors so held): "
            "this engine's load has no prepared file; each start prepares it again"
        )
    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    directory.mkdir(parents=True, exist_ok=True)
    shards = [SHARD_NAME.format(i) for i in range(len(groups))]
    for shard, names in zip(shards, groups, strict=True):
        _write_aligned({n: tensors[n] for n in names}, directory / shard)
    index = {"format": FORMAT, "spec": asdict(spec), "modules": modules, "shards": shards}
    partial = directory / f"{PREPARED_NAME}.partial"
    partial.write_text(json.dumps(index, sort_keys=True, indent=1))
    partial.replace(directory / PREPARED_NAME)  # last: a directory without it holds no prepared model


def _write_aligned(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file whose every tensor starts ALIGN bytes into the file, so that mapped it
    starts on an ALIGN boundary in memory: the panel GEMM reads its panels with aligned vector
    loads (a panel at an odd offset faults). The format has no holes: a pad tensor fills each gap."""
    header: dict[str, object] = {}
    pieces: list[torch.Tensor] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        gap = -offset % ALIGN
        if gap:
            header[f"{_PAD}{len(pieces)}"] = {
                "dtype": "U8",
                "shape": [gap],
                "data_offsets": [offset, offset + gap],
            }
            pieces.append(torch.zeros(gap, dtype=torch.uint8))
            offset += gap
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        pieces.append(tensor)
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # the data then starts on a boundary too
    with path.open("wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for piece in pieces:
            fh.write(piece.reshape(-1).view(torch.uint8).numpy().data)
        fh.flush()
        os.fsync(fh.fileno())


def read_spec(directory: Path) -> PreparedSpec:
    """The spec ``directory``'s prepared model was made for."""
    return PreparedSpec(**_index(directory)["spec"])


def restore_prepared(
    model_dir: Path, cfg: LlamaConfig, model: LlamaForCausalLM, spec: PreparedSpec, device: torch.device
) -> LlamaForCausalLM:
    """Fill ``model`` (built on the meta device) from ``model_dir``'s prepared shards, made for
    ``spec``; the tensors stay views of the files' mapped pages on CPU."""
    index = _index(model_dir)
    found = PreparedSpec(**index["spec"])
    if found != spec:
        raise PreparedMismatch(
            f"{model_dir} was prepared for another engine: {'; '.join(found.differences(spec))}"
        )
    tensors: dict[str, torch.Tensor] = {}
    for shard in index["shards"]:
        loaded = load_file(str(model_dir / shard), device=str(device))
        tensors.update((k, t) for k, t in loaded.items() if not k.startswith(_PAD))
    misaligned = [k for k, t in tensors.items() if t.device.type == "cpu" and t.data_ptr() % ALIGN]
    if misaligned:  # the panel GEMM's aligned loads would fault on these
        raise PreparedMismatch(f"{model_dir}: tensors not on a {ALIGN}-byte boundary: {misaligned[:5]}")
    modules = index["modules"]
    method = quant.method(spec.quantization)
    for name, module in model.named_modules():
        entry = modules.get(name)
        if entry is None:
            raise PreparedMismatch(f"{model_dir}: holds no module {name!r} of this model")
        prefix = f"{name}." if name else ""
        for attr in list(module._parameters):
            kept = attr in entry["parameters"]
            module._parameters[attr] = (
                nn.Parameter(tensors.pop(prefix + attr), requires_grad=False) if kept else None
            )
        for attr in list(module._buffers):
            module._buffers[attr] = tensors.pop(prefix + attr) if attr in entry["buffers"] else None
        if isinstance(module, Linear):
            for flag, value in entry["flags"].items():
                setattr(module, flag, value)
            if entry["quantized"]:
                module.quantization = method
            for attr in entry["tensors"]:
                setattr(module, attr, tensors.pop(f"{name}#{attr}"))
    if tensors:
        raise PreparedMismatch(f"{model_dir}: tensors no module of this model holds: {sorted(tensors)[:5]}")
    if still_meta := model.unfilled():
        raise PreparedMismatch(f"{model_dir}: fills no tensor for {still_meta[:5]}")
    model.rope_cos, model.rope_sin = rope_tables(cfg, device)
    return model.eval().requires_grad_(False)


def _index(directory: Path) -> dict[str, Any]:
    path = directory / PREPARED_NAME
    try:
        index: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PreparedMismatch(f"{path}: not a readable prepared index: {exc}") from exc
    if index.get("format") != FORMAT:
        raise PreparedMismatch(f"{path}: format {index.get('format')!r}, this runtime reads {FORMAT!r}")
    return index
