"""Session fixtures for the engine tests: two tiny checkpoints and their transformers references."""

from __future__ import annotations

import os

# Triton's kernels run on CPU tensors under its interpreter; it picks interpreted or compiled when a
# kernel is defined, so this must be set before the first import of triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest
import torch
from engine_fixtures import Reference, encode_all, hf_greedy
from frontier_runtime.tiny import make_tiny_checkpoint


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():  # noqa: ANN201
    """Tiny models gain nothing from intra-op threads, and on a shared CI machine every OpenMP
    barrier waiting for a descheduled thread costs milliseconds (measured: 8x slower with 2)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gqa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local stack's model: hidden 256, 4 layers, 8 query / 4 KV heads, untied."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gqa"), seed=0)


@pytest.fixture(scope="session")
def tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Smaller, tied embeddings, llama3 rope scaling, weights split over two safetensors shards."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("tied"),
        seed=1,
        shards=2,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=344,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )


@pytest.fixture(scope="session")
def gqa_ref(gqa_dir: Path) -> Reference:
    prompts = encode_all(gqa_dir)
    return Reference(gqa_dir, prompts, hf_greedy(gqa_dir, prompts))


@pytest.fixture(scope="session")
def tied_ref(tied_dir: Path) -> Reference:
    prompts = encode_all(tied_dir)
    return Reference(tied_dir, prompts, hf_greedy(tied_dir, prompts))
