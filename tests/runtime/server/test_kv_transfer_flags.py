"""``serve --kv-role/--kv-host``: one release's ``runtime.yaml`` (``kv_transfer.role: both``) runs
either half of a disaggregated pool, as a Kubernetes pod starts it (its role from its Deployment,
its address from the downward API). Real: the runtime as a process on loopback sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from frontier_hostside import names
from frontier_runtime.__main__ import main
from server_harness import MODEL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def colocated_config(path: Path, model_dir: Path, kv_port: int, **fields: object) -> Path:
    config = {
        "model": {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": 256},
        "max_concurrency": 4,
        "queue": {"max_length": 8, "timeout_ms": 30_000},
        "batch": {"window_ms": 0, "max_batch_size": 4, "max_num_batched_tokens": 512},
        "cpu_kv_cache_bytes": 16 * 1024 * 1024,
        "device": "cpu",
        "kv_transfer": {"role": "both", "port": kv_port},
        **fields,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_decode_role_on_the_command_line_is_refused_without_prefix_caching(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture
) -> None:
    config = colocated_config(tmp_path / "runtime.yaml", tiny_model, 5600, prefix_caching=False)
    assert main(["serve", "--config", str(config), "--kv-role", "decode"]) == 2
    assert "--kv-role/--kv-host: prefix_caching = False" in capsys.readouterr().err


def test_an_unknown_role_is_refused_by_the_command_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--config", "runtime.yaml", "--kv-role", "both"])
    assert exit_info.value.code == 2 and "'prefill', 'decode'" in capsys.readouterr().err


def test_a_colocated_config_served_with_kv_role_prefill_leases_its_blocks_at_the_kv_host(
    tmp_path: Path, tiny_model: Path
) -> None:
    kv_port, http_port = free_port(), free_port()
    config = colocated_config(tmp_path / "runtime.yaml", tiny_model, kv_port)
    process = subprocess.Popen(
        [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config)]
        + ["--host", "127.0.0.1", "--port", str(http_port), "--model-dir", str(tiny_model)]
        + ["--kv-role", "prefill", "--kv-host", "127.0.0.1"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 90
        while not _ready(base) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _ready(base), "the runtime never became ready"
        body = {
            "prompt": list(range(1, 70)),
            "max_tokens": 1,
            "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        answer = httpx.post(base + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        params = answer.json()["kv_transfer_params"]
        assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", kv_port)
        assert len(params["remote_block_ids"]) == 4  # 68 tokens before the last: four full blocks
        with socket.create_connection(("127.0.0.1", kv_port), timeout=5):
            pass  # the transfer listener is up where the answer says
    finally:
        process.terminate()
        process.communicate(timeout=60)


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + names.READINESS_PATH, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
