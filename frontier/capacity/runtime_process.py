"""A runtime process on this machine, on a free loopback port, for what the planner measures: the
server's own overhead (``cpu.fit_server_overhead``) and the pass rate of each weights variant
(``quality.measure``). It is the runtime users deploy (``python -m frontier_runtime serve``), started
with a ``runtime.yaml`` written from the given settings."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from frontier.errors import FrontierError

READY_PATH = "/health/ready"


class RuntimeStartError(FrontierError):
    """The runtime exited, or was not ready in time; the message carries its log's tail."""


@dataclass(frozen=True)
class Served:
    url: str
    pid: int


@contextlib.contextmanager
def serve_locally(
    config: dict[str, Any], model_dir: Path, workdir: Path, *, name: str, timeout_s: float = 240.0
) -> Iterator[Served]:
    """``config`` (a runtime.yaml's fields) served from ``model_dir`` for the length of the ``with``;
    its config and log are ``workdir/<name>.yaml`` and ``workdir/<name>.log``."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path, log_path = workdir / f"{name}.yaml", workdir / f"{name}.log"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [
        sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config_path),
        "--host", "127.0.0.1", "--port", str(port), "--model-dir", str(model_dir),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(process, url, log_path, name, timeout_s)
        yield Served(url, process.pid)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise RuntimeStartError(f"the runtime {name} exited before it was ready:\n{tail}")
        try:
            if httpx.get(url + READY_PATH, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeStartError(f"the runtime {name} was not ready within {timeout_s:g}s (log: {log})")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
