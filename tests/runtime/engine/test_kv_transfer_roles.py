"""Disaggregation roles: what each role accepts, and the settings refused before anything starts.
No listener here (a colocated engine opens none); the transfers themselves are test_kv_transfer.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from frontier_runtime.config import RuntimeSettings
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import KvTransferParams, SamplingParams
from frontier_settings import ConfigError
from pydantic import ValidationError

TO_DECODE = KvTransferParams(do_remote_decode=True)
FROM_PREFILL = KvTransferParams(
    do_remote_prefill=True,
    remote_engine_id="e",
    remote_request_id="r",
    remote_host="127.0.0.1",
    remote_port=5600,
    remote_block_ids=(1, 2),
)


def test_a_colocated_replica_refuses_both_kinds_of_transfer_request_naming_its_role(gqa_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(gqa_dir, num_blocks=16, max_seq_len=128, device="cpu"))
    try:
        assert engine.kv_transfer.server is None
        with pytest.raises(ValueError, match="kv_transfer.role 'prefill', this one is 'both'"):
            engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=1, kv_transfer=TO_DECODE))
        with pytest.raises(ValueError, match="kv_transfer.role 'decode', this one is 'both'"):
            engine.add_request("b", [1, 2, 3], SamplingParams(kv_transfer=FROM_PREFILL))
    finally:
        engine.shutdown()


def test_a_decode_role_without_prefix_caching_is_refused_naming_the_field() -> None:
    with pytest.raises(
        (ValidationError, ConfigError), match="prefix_caching = False: must be true when kv_transfer.role"
    ):
        RuntimeSettings(kv_transfer={"role": "decode"}, prefix_caching=False)


def test_a_disaggregated_role_on_several_ranks_is_refused_naming_the_field() -> None:
    with pytest.raises(
        (ValidationError, ConfigError),
        match="kv_transfer.role = 'prefill': must be 'both' on a replica of 2 ranks",
    ):
        RuntimeSettings(kv_transfer={"role": "prefill"}, tensor_parallel_size=2)


def test_the_transfer_settings_are_checked_against_their_ranges() -> None:
    with pytest.raises(ValidationError, match="kv_transfer.port"):
        RuntimeSettings(kv_transfer={"port": 80})
    with pytest.raises(ValidationError, match="kv_transfer.on_failure"):
        RuntimeSettings(kv_transfer={"on_failure": "retry"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"do_remote_decode": True, "do_remote_prefill": True}, "cannot both be true"),
        (
            {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r", "remote_port": 1},
            "remote_host is required",
        ),
        ({"remote_port": 70000}, "remote_port must be within 1..65535, got 70000"),
        ({"tp_size": 2}, "tp_size must be 1"),
    ],
)
def test_bad_kv_transfer_params_are_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KvTransferParams(**fields)  # type: ignore[arg-type]
