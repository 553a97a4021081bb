"""Helpers shared by the engine tests: prompts, transformers references, random fillers."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from frontier_runtime.ops import cpu_kernel

MAX_NEW = 24
# Tests of the native CPU kernels themselves: they need a prebuilt variant loaded
# (`assert_prebuilt_kernels_loaded`), and the run on torch ops alone (`make test-torch-ops`,
# FRONTIER_NATIVE_KERNELS=0) deselects them with -m "not native_kernels".
needs_native_kernels = pytest.mark.native_kernels


def assert_prebuilt_kernels_loaded() -> None:
    """A prebuilt variant of the native CPU kernels is loaded (``make install`` builds them)."""
    assert cpu_kernel.load(), (
        f"no prebuilt variant of the native CPU kernels loaded from {cpu_kernel.KERNEL_DIR} (the log says why): "
        "build them with `python -m frontier_runtime.ops.build_kernels`"
    )


PROMPT_TEXTS = [
    "Hello",
    "The model token cache",
    "Deploy the canary, then drain the old node and watch latency.",
    "café naïve über 東京 日本語 🚀 river mountain garden",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty twenty-one twenty-two",
    "A much longer prompt about clusters, weights, tensors and streams. " * 4,
    "x",
    "Morning coffee, evening music, winter letters and summer stories " * 2,
]


@dataclass(frozen=True)
class Reference:
    model_dir: Path
    prompts: list[list[int]]
    outputs: list[list[int]]  # transformers greedy, one prompt at a time, no padding


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new: int = MAX_NEW) -> list[list[int]]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False
            )
            outs.append(out[0, len(p) :].tolist())
    return outs


def random_fillers(n: int, seed: int, vocab: int = 4096) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, vocab) for _ in range(rng.randint(3, 60))] for _ in range(n)]


def encode_all(model_dir: Path) -> list[list[int]]:
    from frontier_runtime.tokenizer import Tokenizer

    tok = Tokenizer(model_dir)
    return [tok.encode(t) for t in PROMPT_TEXTS]


def generate_tracking_batch(engine, prompts: list[list[int]], params) -> tuple[list[list[int]], int]:  # noqa: ANN001
    """Run prompts to completion step by step; returns outputs and the largest batch of a step."""
    ids = [f"track-{i}" for i in range(len(prompts))]
    plist = params if isinstance(params, list) else [params] * len(prompts)
    for rid, p, sp in zip(ids, prompts, plist, strict=True):
        engine.add_request(rid, p, sp)
    got: dict[str, list[int]] = {rid: [] for rid in ids}
    largest = 0
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
        largest = max(largest, engine.stats().last_batch_size)
    return [got[rid] for rid in ids], largest
