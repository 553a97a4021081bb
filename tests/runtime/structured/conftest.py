"""A tiny real checkpoint (random weights, trained byte-level BPE tokenizer) and one engine over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.tiny import make_tiny_checkpoint

SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("structured-tiny"), seed=0, **SHAPE)


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[LLMEngine]:
    torch.set_num_threads(1)
    eng = LLMEngine(tiny_dir, max_seq_len=256, cpu_kv_cache_bytes=16 * 1024 * 1024)
    yield eng
    eng.shutdown()
