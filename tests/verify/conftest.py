"""Fixtures: one real runtime process serving a tiny random model on a free loopback port, a copy
of the local stack pointed at it with its history on moto's server, and a listening socket that
tells whether anything connected."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from frontier import project
from tests.gateway.harness import RuntimeProcess, start_runtime, wait_ready
from tests.moto_server import moto_server, reset
from tests.verify.harness import CONTEXT, MODEL, SHAPE


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    from frontier_runtime.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("verify-runtime")
    model_dir = make_tiny_checkpoint(root / MODEL, seed=5, **SHAPE)
    process = start_runtime(MODEL, model_dir, root / "work")
    try:
        wait_ready([process])
        yield process
    finally:
        process.kill()


@pytest.fixture
def write_set(tmp_path: Path) -> Callable[[str], Path]:
    """``write_set(yaml_text)`` → the path of a verification set file holding it."""

    def write(text: str, name: str = "set.yaml") -> Path:
        path = tmp_path / "sets" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def history(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty account on moto's server, where the stack's history (and its recordings) is kept:
    the standard ``AWS_ENDPOINT_URL`` points the local stack's clients at it."""
    reset(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return moto_endpoint


@pytest.fixture
def local_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, history: str) -> Callable[..., Path]:
    """``local_stack(set_path, min_pass_rate=1.0)``: a copy of the local stack serving the test's model
    with that verification set, its history on moto's server; ``fab -s local`` reads it."""

    def make(set_path: Path, min_pass_rate: float = 1.0) -> Path:
        stacks = tmp_path / "stacks"
        if not stacks.exists():
            shutil.copytree(
                project.root() / "stacks", stacks, ignore=shutil.ignore_patterns("baselines", "verify")
            )
        path = stacks / "Pulumi.local.yaml"
        document = yaml.safe_load((project.root() / "stacks" / "Pulumi.local.yaml").read_text())
        config = document["config"]
        config["frontier:model"].update(name=MODEL, max_seq_len=CONTEXT)
        config["frontier:verify"] = {"file": str(set_path), "min_pass_rate": min_pass_rate}
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks))
        return path

    return make


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A real listening socket on a free port: ``harness.connected(listener)`` says whether anything came."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()
