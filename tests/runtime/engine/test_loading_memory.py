"""Loading a sharded checkpoint of a few hundred MB: the peak resident memory the load adds stays
within 1.2 x the weights the rank ends up holding, in float32 and bfloat16, whole and as each of
two tensor-parallel ranks (which read only their own slices).

Each load runs in a fresh subprocess: the kernel's high-water mark of resident memory (VmHWM) is
reset (``/proc/self/clear_refs``) after the imports and a warm-up load of a one-layer model, so it
measures what the load adds for its weights. The warm-up pages in the code a load runs (oneDNN's
first reorder alone maps ~15 MB of libtorch's text, more or less depending on the page cache):
shared, file-backed pages that do not grow with the model and would blur a ratio taken on a
model of a few hundred MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from frontier_runtime.distributed import TPGroup
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.loader import build_on_meta, load_model
from frontier_runtime.tiny import make_tiny_checkpoint

# ~79M parameters, float32 on disk in 4 shards: 314 MB.
SHAPE = {
    "hidden_size": 1024,
    "num_layers": 6,
    "num_heads": 16,
    "num_kv_heads": 8,
    "intermediate_size": 2816,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
}
SMALL = {"hidden_size": 64, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}
MEASURE = textwrap.dedent(
    """
    import json, sys
    import torch
    from frontier_runtime.distributed import TPGroup
    from frontier_runtime.models.llama.loader import load_model

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    model_dir, dtype, rank, world = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    load_model(sys.argv[5], dtype, "cpu", TPGroup(rank, world))  # warm-up: pages the code in
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
    model = load_model(model_dir, dtype, "cpu", TPGroup(rank, world))
    peak = status("VmHWM")
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    held += sum(t.numel() * t.element_size() for t in (model.rope_cos, model.rope_sin))
    cpu_weights = [getattr(m, "weight_t", None) for m in model.modules()]
    cpu_weights += [getattr(m, "packed", None) for m in model.modules()]
    held += sum(w.numel() * w.element_size() for w in cpu_weights if w is not None)
    print(json.dumps({"added": peak - before, "held": held}))
    """
)


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("big"), seed=0, shards=4, **SHAPE)


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("warm"), seed=1, **SMALL)


def _measure(model_dir: Path, warm_dir: Path, dtype: str, rank: int, world: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(model_dir), dtype, str(rank), str(world), str(warm_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "rank", "world"), [("float32", 0, 1), ("bfloat16", 0, 1), ("float32", 0, 2), ("float32", 1, 2)]
)
def test_peak_memory_of_a_load_stays_near_the_weights_held(
    big_dir: Path, warm_dir: Path, dtype: str, rank: int, world: int
) -> None:
    on_disk = sum(p.stat().st_size for p in big_dir.glob("*.safetensors"))
    assert on_disk > 250e6  # a checkpoint of a few hundred MB
    got = _measure(big_dir, warm_dir, dtype, rank, world)
    if world == 2:
        assert got["held"] < 0.6 * on_disk  # the rank holds its half (plus the whole embeddings)
    assert got["added"] <= 1.2 * got["held"], got


def test_the_model_is_built_without_storage(tmp_path: Path) -> None:
    model = build_on_meta(LlamaConfig.from_dir(make_tiny_checkpoint(tmp_path, seed=2, **SMALL)))
    assert all(p.is_meta for p in model.parameters())


def test_a_rank_reads_only_its_slices(tmp_path: Path) -> None:
    model_dir = make_tiny_checkpoint(tmp_path, seed=3, shards=2, **SMALL)
    whole = load_model(model_dir, torch.float32, "cpu")
    halves = [load_model(model_dir, torch.float32, "cpu", TPGroup(r, 2)) for r in range(2)]
    w = whole.layers[0].mlp.down_proj.dense_weight()  # [out, in]: rank r holds input columns r
    assert torch.equal(torch.cat([h.layers[0].mlp.down_proj.dense_weight() for h in halves], 1), w)
    qkv = [h.layers[0].self_attn.qkv_proj.dense_weight() for h in halves]
    assert qkv[0].shape[0] * 2 == whole.layers[0].self_attn.qkv_proj.dense_weight().shape[0]
    assert torch.equal(halves[0].embed_tokens.weight, whole.embed_tokens.weight)


def test_a_checkpoint_tensor_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    model_dir = make_tiny_checkpoint(tmp_path, seed=4, **SMALL)
    path = model_dir / "model.safetensors"
    weights = load_file(str(path))
    weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"][
        :, :32
    ].contiguous()
    save_file(weights, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="up_proj"):
        load_model(model_dir, torch.float32, "cpu")
