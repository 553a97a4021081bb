"""Build a ``LlamaForCausalLM`` and fill it from a safetensors checkpoint, sharded for its rank.

Reads ``model.safetensors``, or the shards listed in ``model.safetensors.index.json``, or every
``*.safetensors`` file of the directory; a directory holding ``prepared.safetensors`` (the tensors of
an earlier load, laid out for this engine: ``prepared``) is mapped instead, with no packing.

The path is the same on CPU and CUDA, and its memory stays near the size of one rank's weights:

- the model is built on the meta device with parameter init skipped (no storage, no random
  numbers; skipping init also keeps torch's meta kernels, ~800 modules and seconds to import, out);
- each parameter is then allocated once, on its device and in its target dtype, and filled piece by
  piece: q/k/v and gate/up go straight into their slices of the fused projections, cast by the
  copy, so no float32 or whole-model copy ever exists;
- a float32 projection packed for the CPU's panel GEMM is filled straight into its panels, each
  piece transposed from the checkpoint's mapped file into place: one allocation and one pass over
  the bytes, where filling [out, in] and packing after made two (measured 2x faster on a 1 GB model);
- each piece is this rank's slice only, read with safetensors' ``get_slice`` from a file opened for
  that one tensor: a rank never reads the other ranks' heads or MLP columns, and the file's mapped
  pages are released after every tensor rather than accumulating over a multi-GB shard.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from frontier_runtime.distributed import SINGLE, Placement, TPGroup
from frontier_runtime.models.llama import prepared, quant
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import Linear, rope_tables
from frontier_runtime.models.llama.model import LlamaForCausalLM
from frontier_runtime.models.llama.moe import SparseMoE
from frontier_runtime.ops import panel_gemm

# nn.Linear / nn.Embedding call these from reset_parameters; on the meta device they would only
# pull in torch's meta kernels, and every value is overwritten from the checkpoint anyway.
_INIT_FUNCTIONS = ("kaiming_uniform_", "uniform_", "normal_", "trunc_normal_", "xavier_uniform_")


@contextlib.contextmanager
def _skipped_init() -> Iterator[None]:
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    try:
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


@functools.cache
def _libc_malloc_trim() -> ctypes._CFuncPtr | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc). Once glibc has freed a few multi-MB
    blocks its mmap threshold grows, later blocks of that size come from the heap, and the heap
    keeps what is freed: without this, each layout swap below (a new copy, then the old one freed)
    would leave its old copy resident, ~25 % over the weights at the peak."""
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)


def build_on_meta(
    cfg: LlamaConfig, tp: TPGroup = SINGLE, placement: Placement | None = None
) -> LlamaForCausalLM:
    """The model's modules with every parameter on the meta device: shapes only, no memory."""
    with _skipped_init(), torch.device("meta"):
        return LlamaForCausalLM(cfg, tp, placement)


def _checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors, index or *.safetensors files")
    return found


class Checkpoint:
    """Where each tensor lives, and this rank's slice of it on demand."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.location: dict[str, Path] = {}
        for path in _checkpoint_files(model_dir):
            with safe_open(str(path), framework="pt") as f:  # reads the header only
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    self.location[name] = path
        self.unread = set(self.location)

    def __contains__(self, name: str) -> bool:
        return name in self.location

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape, from its file's header (no data read)."""
        with safe_open(str(self.location[name]), framework="pt") as f:
            return tuple(f.get_slice(name).get_shape())

    def read(self, name: str, tp: TPGroup = SINGLE, dim: int | None = None) -> torch.Tensor:
        """Tensor ``name`` (its rank's contiguous slice along ``dim`` when given), in its stored dtype."""
        path = self.location.get(name)
        if path is None:
            raise KeyError(f"{self.model_dir}: checkpoint lacks tensor {name!r}")
        self.unread.discard(name)
        with safe_open(str(path), framework="pt") as f:
            piece = f.get_slice(name)
            shape = piece.get_shape()
            if dim is None or tp.world_size == 1:
                return piece[:]
            size = shape[dim]
            if size % tp.world_size:
                raise ValueError(
                    f"{self.model_dir}: {name} dimension {dim} of size {size} does not split over "
                    f"{tp.world_size} ranks"
                )
            part = size // tp.world_size
            index = [slice(None)] * len(shape)
            index[dim] = slice(tp.rank * part, (tp.rank + 1) * part)
            return piece[tuple(index)]


class _Filler:
    """Allocates each parameter on its device in its dtype and copies checkpoint pieces into it."""

    quantizer: quant.WeightQuantizer | None = None  # fills the linear projections under model.quantization

    def __init__(self, ckpt: Checkpoint, tp: TPGroup, dtype: torch.dtype, device: torch.device) -> None:
        self.ckpt, self.tp, self.dtype, self.device = ckpt, tp, dtype, device

    def fill(
        self,
        module: nn.Module,
        attr: str,
        what: str,
        pieces: list[tuple[str, int | None]],
        shards: TPGroup | None = None,
    ) -> None:
        """``module.<attr>`` from ``pieces`` (checkpoint name, shard dim) stacked along dim 0, each
        sliced over ``shards`` (default: the tensor-parallel group)."""
        quantizer = self.quantizer
        if (
            quantizer is not None
            and isinstance(module, Linear)
            and attr == "weight"
            and quantizer.covers(what)
        ):
            quantizer.fill(module, what, pieces, shards or self.tp)
            _return_freed_memory()  # the projection's float copies, as after each packing below
            return
        meta = getattr(module, attr)
        if isinstance(module, Linear) and self._fills_panels(attr, pieces, shards):
            self._fill_panels(module, what, pieces, shards)
            return
        # A CPU linear multiplies by a oneDNN-packed float32 weight (filled [out, in], then packed),
        # or else by its weight laid out [in, out]: filled in that layout directly, so no second
        # copy of the weight ever exists (a swap after loading would hold both at once).
        layout, packed = None, False
        if isinstance(module, Linear) and attr == "weight" and self.device.type == "cpu":
            layout = Linear.transposed_dtype(self.dtype)
            packed = Linear.packs(self.dtype)
        if layout is None or packed:
            target = torch.empty(meta.shape, dtype=layout or self.dtype, device=self.device)
            rows_of = target
        else:
            target = torch.empty(tuple(reversed(meta.shape)), dtype=layout, device=self.device)
            rows_of = target.t()
        row = 0
        for name, dim in pieces:
            value = self.ckpt.read(name, shards or self.tp, dim)
            rows = value.shape[0] if value.dim() else 1
            if tuple(value.shape[1:]) != tuple(meta.shape[1:]) or row + rows > meta.shape[0]:
                raise ValueError(
                    f"{self.ckpt.model_dir}: {what} gets {name} of shape {tuple(value.shape)} "
                    f"(this rank's slice), which does not fit the expected {tuple(meta.shape)}"
                )
            # Casts on the way (through the model's dtype first, so a widened copy holds exactly
            # its 16-bit values): no full-precision copy of the weight stays.
            rows_of[row : row + rows].copy_(
                value.to(self.dtype) if layout not in (None, self.dtype) else value
            )
            row += rows
            del value
        if row != meta.shape[0]:
            raise ValueError(
                f"{self.ckpt.model_dir}: {what} has {row} rows from the checkpoint, expected {meta.shape[0]}"
            )
        if packed:
            module.adopt_packed(target, self.dtype)
            del target, rows_of
            _return_freed_memory()
        elif layout is None:
            module._parameters[attr] = nn.Parameter(target, requires_grad=False)
        else:
            module.adopt_transposed(target, self.dtype)

    def _fills_panels(self, attr: str, pieces: list[tuple[str, int | None]], shards: TPGroup | None) -> bool:
        """Whether ``module.<attr>`` goes straight from the checkpoint into the panel GEMM's layout: a
        float32 CPU projection whose every piece is a whole number of panels (rows, before slicing)."""
        if not (
            attr == "weight"
            and self.device.type == "cpu"
            and self.dtype == torch.float32
            and Linear.packs(torch.float32)
            and panel_gemm.available()
        ):
            return False
        ranks = (shards or self.tp).world_size
        for name, dim in pieces:
            if name not in self.ckpt:
                return False
            rows = self.ckpt.shape(name)[0]
            if (rows // ranks if dim == 0 else rows) % panel_gemm.PANEL:
                return False
        return True

    def _fill_panels(
        self, module: Linear, what: str, pieces: list[tuple[str, int | None]], shards: TPGroup | None
    ) -> None:
        """Each piece, as it is read from the checkpoint's mapped file, transposed into its panels: one
        allocation and one pass over the bytes, where filling [out, in] and then packing made two."""
        out_features, in_features = module.weight.shape
        panels = torch.empty(out_features // panel_gemm.PANEL, in_features, panel_gemm.PANEL)
        row = 0
        for name, dim in pieces:
            value = self.ckpt.read(name, shards or self.tp, dim)
            rows = value.shape[0]
            if tuple(value.shape[1:]) != (in_features,) or row + rows > out_features:
                raise ValueError(
                    f"{self.ckpt.model_dir}: {what} gets {name} of shape {tuple(value.shape)} "
                    f"(this rank's slice), which does not fit the expected {(out_features, in_features)}"
                )
            first = row // panel_gemm.PANEL
            target = panels[first : first + rows // panel_gemm.PANEL]
            target.copy_(value.reshape(-1, panel_gemm.PANEL, in_features).transpose(1, 2))
            row += rows
            del value
        if row != out_features:
            raise ValueError(
                f"{self.ckpt.model_dir}: {what} has {row} rows from the checkpoint, expected {out_features}"
            )
        module.adopt_panels(panels)


def moe_prefix(cfg: LlamaConfig, layer: int) -> str:
    """Where a sparse layer's router and experts live in the checkpoint."""
    return f"model.layers.{layer}." + ("block_sparse_moe." if cfg.model_type == "mixtral" else "mlp.")


# An expert's gate, up and down projections as each family names them.
EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
QWEN_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


def check_experts(cfg: LlamaConfig, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint whose routers or experts do not match config.json, before any weight is read."""
    for i in cfg.sparse_layers:
        p = moe_prefix(cfg, i)
        router = p + "gate.weight"
        if router not in ckpt:
            raise ValueError(f"{ckpt.model_dir}: checkpoint lacks the router {router} of sparse layer {i}")
        want = (cfg.num_experts, cfg.hidden_size)
        got = ckpt.shape(router)
        if got != want:
            raise ValueError(
                f"{ckpt.model_dir}: {router} has shape {got} but config.json says num_experts "
                f"{cfg.num_experts} x hidden_size {cfg.hidden_size} {want}"
            )
        stored = {
            name[len(p + "experts.") :].split(".")[0]
            for name in ckpt.location
            if name.startswith(p + "experts.")
        }
        if stored != {str(e) for e in range(cfg.num_experts)}:
            raise ValueError(
                f"{ckpt.model_dir}: layer {i} stores {len(stored)} experts, config.json says num_experts "
                f"{cfg.num_experts}"
            )


def _fill_sparse_mlp(
    put: Callable[..., None], cfg: LlamaConfig, moe: SparseMoE, layer: int, placement: Placement
) -> None:
    """The router whole, and this rank's experts only, each one's slice like the dense MLP's (gate/up
    by rows, down by columns) over the ranks sharing it; the shared expert's slice over the stage."""
    p = moe_prefix(cfg, layer)
    put(moe.gate, "weight", p + "gate", [(p + "gate.weight", None)])
    gate, up, down = EXPERT_NAMES.get(cfg.model_type, QWEN_EXPERT_NAMES)
    experts: list[tuple[str, nn.Module, TPGroup]] = [
        (f"{p}experts.{e}.", x, placement.expert_columns)
        for e, x in zip(moe.expert_ids, moe.experts, strict=True)
    ]
    if moe.shared_expert is not None and moe.shared_expert_gate is not None:
        experts.append((p + "shared_expert.", moe.shared_expert, placement.stage))
        put(
            moe.shared_expert_gate,
            "weight",
            p + "shared_expert_gate",
            [(p + "shared_expert_gate.weight", None)],
        )
    for name, expert, shards in experts:
        put(
            expert.gate_up_proj,
            "weight",
            name + "gate_up_proj",
            [(f"{name}{gate}.weight", 0), (f"{name}{up}.weight", 0)],
            shards,
        )
        put(expert.down_proj, "weight", name + "down_proj", [(f"{name}{down}.weight", 1)], shards)


def _other_ranks_tensors(model: LlamaForCausalLM, ckpt: Checkpoint) -> set[str]:
    """The checkpoint's tensors that other pipeline stages or expert shards hold (never read here)."""
    absent = set()
    if model.embed_tokens is None:
        absent.add("model.embed_tokens.weight")
    if model.norm is None:  # not the last stage
        absent |= {"model.norm.weight", "lm_head.weight"}
    others = {name for name in ckpt.location if name in absent}
    for name in ckpt.location:
        if not name.startswith("model.layers."):
            continue
        layer = int(name.split(".")[2])
        if layer not in model.layer_ids:
            others.add(name)
        elif ".experts." in name:
            mlp = model.layers[layer - model.layer_ids.start].mlp
            expert = int(name.split(".experts.")[1].split(".")[0])
            if isinstance(mlp, SparseMoE) and expert not in mlp.expert_ids:
                others.add(name)
    return others


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tp: TPGroup = SINGLE,
    placement: Placement | None = None,
    quantization: str = "none",
) -> LlamaForCausalLM:
    """Build the model on ``device`` and fill it from the checkpoint, sharded for ``tp`` (or, under
    expert or pipeline parallelism, for ``placement``): only this rank's tensors are read.
    ``quantization`` (``model.quantization``) quantizes the linear projections (see ``quant``)."""
    model_dir = Path(model_dir)
    device = torch.device(device)
    problem = quant.device_problem(quantization, device.type)
    if problem:
        raise quant.QuantizationError(problem)
    method = quant.method(quantization)
    stored = quant.checkpoint_scheme(model_dir, method)  # refused before any weight is read
    cfg = LlamaConfig.from_dir(model_dir)
    placement = placement or Placement.of_tensor_parallel(tp)
    model = build_on_meta(cfg, placement=placement)
    if (model_dir / prepared.PREPARED_NAME).is_file():  # laid out by an earlier load: no packing
        spec = prepared.spec_for(device, dtype, quantization, placement)
        return prepared.restore_prepared(model_dir, cfg, model, spec, device)
    ckpt = Checkpoint(model_dir)
    check_experts(cfg, ckpt)
    filler = _Filler(ckpt, placement.tp, dtype, device)
    if method.quantizes():
        filler.quantizer = quant.WeightQuantizer(method, ckpt, stored, device)
    put = filler.fill

    if model.embed_tokens is not None:
        put(model.embed_tokens, "weight", "embed_tokens", [("model.embed_tokens.weight", None)])
    if model.norm is not None:
        put(model.norm, "weight", "norm", [("model.norm.weight", None)])
    if model.lm_head is not None:
        put(model.lm_head, "weight", "lm_head", [("lm_head.weight", None)])
    ckpt.unread -= _other_ranks_tensors(model, ckpt)
    ckpt.unread.discard("lm_head.weight")  # tied checkpoints sometimes carry a copy anyway
    for i, layer in zip(model.layer_ids, model.layers, strict=True):
        p = f"model.layers.{i}."
        put(layer.input_layernorm, "weight", p + "input_layernorm", [(p + "input_layernorm.weight", None)])
        put(
            layer.post_attention_layernorm,
            "weight",
            p + "post_attention_layernorm",
            [(p + "post_attention_layernorm.weight", None)],
        )
        a = p + "self_attn."
        attn = layer.self_attn
        put(attn.qkv_proj, "weight", a + "qkv_proj", [(a + f"{x}_proj.weight", 0) for x in "qkv"])
        if cfg.attention_bias:
            put(attn.qkv_proj, "bias", a + "qkv_proj.bias", [(a + f"{x}_proj.bias", 0) for x in "qkv"])
        put(attn.o_proj, "weight", a + "o_proj", [(a + "o_proj.weight", 1)])
        if attn.q_norm is not None and attn.k_norm is not None:  # one head_dim weight, on every rank
            put(attn.q_norm, "weight", a + "q_norm", [(a + "q_norm.weight", None)])
            put(attn.k_norm, "weight", a + "k_norm", [(a + "k_norm.weight", None)])
        mlp = layer.mlp
        if isinstance(mlp, SparseMoE):
            _fill_sparse_mlp(put, cfg, mlp, i, placement)
            continue
        m = p + "mlp."
        put(
            mlp.gate_up_proj,
            "weight",
            m + "gate_up_proj",
            [(m + "gate_proj.weight", 0), (m + "up_proj.weight", 0)],
        )
        put(mlp.down_proj, "weight", m + "down_proj", [(m + "down_proj.weight", 1)])
        if cfg.mlp_bias:
            put(
                mlp.gate_up_proj,
                "bias",
                m + "gate_up_proj.bias",
                [(m + "gate_proj.bias", 0), (m + "up_proj.bias", 0)],
            )
            if mlp.down_proj.bias is not None:  # added once, on rank 0, before the all-reduce
                put(mlp.down_proj, "bias", m + "down_proj.bias", [(m + "down_proj.bias", None)])
            else:
                ckpt.unread.discard(m + "down_proj.bias")
    leftover = sorted(k for k in ckpt.unread if not k.endswith("rotary_emb.inv_freq"))
    if leftover:
        raise ValueError(f"{model_dir}: unexpected tensors in checkpoint: {leftover[:5]}")
    if still_meta := model.unfilled():
        raise ValueError(f"{model_dir}: no checkpoint tensor filled {still_meta[:5]}")
    model.rope_cos, model.rope_sin = rope_tables(cfg, device)
    if device.type == "cpu":
        for module in model.modules():
            if isinstance(module, Linear):
                module.use_transposed_weight()
                module.pack()
                _return_freed_memory()
    return model.eval().requires_grad_(False)
