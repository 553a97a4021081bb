"""``keys.rotate`` on runtime processes under load: the new key is added, every replica serves it,
the old one is retired after the overlap, and not one request fails on the way. Two runtimes run on
free loopback ports, their keys in moto's Secrets Manager server; clients take the secret's first
key, as the gateway does, and so move to the new key once it is published."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from frontier_hostside import names
from frontier_runtime.server.auth import fingerprint_of

from frontier.access.keys import Replica, RotationError, rotate, timing_problems
from tests.moto_server import moto_server, reset

SECRET = "frontier/test/rotated-keys"
OLD = "sk-before-rotation-0123456789"
MODEL = "tiny"
RELOAD_S = 5  # the shortest interval the runtime allows
CLIENTS = 3


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    with moto_server() as endpoint:
        reset(endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        client = boto3.client("secretsmanager")
        client.create_secret(Name=SECRET, SecretString=json.dumps({"keys": [OLD]}))
        yield client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def runtimes(secrets, tiny_model: Path, tmp_path: Path) -> Iterator[list[str]]:
    config = {
        "model": {"name": MODEL, "weights_uri": str(tiny_model), "max_seq_len": 256},
        "api_keys_secret": SECRET,
        "api_keys_reload_s": RELOAD_S,
        "max_concurrency": 4,
        "queue": {"max_length": 64, "timeout_ms": 30_000},
        "batch": {"window_ms": 0, "max_batch_size": 4, "max_num_batched_tokens": 512},
        "cpu_kv_cache_bytes": 16 * 1024 * 1024,
        "drain_timeout_s": 5,
        "log_level": "warning",
        "device": "cpu",
        "cpu_threads": 1,
    }
    (tmp_path / "runtime.yaml").write_text(yaml.safe_dump(config))
    procs, urls = [], []
    for _ in range(2):
        port = _free_port()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "frontier_runtime", "serve", "--config", "runtime.yaml"]
                + ["--host", "127.0.0.1", "--port", str(port)],
                cwd=tmp_path,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / f"runtime-{port}.log").open("w"),
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    for proc, url in zip(procs, urls, strict=True):
        while True:
            assert proc.poll() is None, f"runtime {url} exited"
            try:
                if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"runtime {url} not ready"
            time.sleep(0.2)
    yield urls
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _replicas(urls: list[str]) -> list[Replica]:
    return [Replica(url, lambda url=url: httpx.get(url + names.METRICS_PATH, timeout=5).text) for url in urls]


def _status(url: str, key: str) -> int:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    reply = httpx.post(
        url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    return reply.status_code


class Load:
    """Clients sending completions round-robin to every runtime with the secret's first key,
    read again every half second (the way the gateway follows the secret, only faster)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.key = OLD
        self.outcomes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._follow, daemon=True)]
        self.threads += [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)
        ]

    def _follow(self) -> None:
        client = boto3.client("secretsmanager")
        while not self.stop.wait(0.5):
            self.key = json.loads(client.get_secret_value(SecretId=SECRET)["SecretString"])["keys"][0]

    def _client(self, i: int) -> None:
        n = i
        while not self.stop.is_set():
            url, key = self.urls[n % len(self.urls)], self.key
            n += 1
            try:
                status = _status(url, key)
            except httpx.HTTPError as exc:
                status, detail = -1, type(exc).__name__
            else:
                detail = str(status)
            self.outcomes["old" if key == OLD else "new"] += 1
            if status != 200:
                self.failures.append(f"{url} with the {'old' if key == OLD else 'new'} key: {detail}")

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def test_a_rotation_under_load_fails_no_request_and_the_old_key_is_refused_after(secrets, runtimes) -> None:
    lines: list[str] = []
    with Load(runtimes) as load:
        time.sleep(1)
        rotation = rotate(
            secrets,
            SECRET,
            _replicas(runtimes),
            wait_s=4 * RELOAD_S,
            overlap_s=RELOAD_S,
            progress=lines.append,
        )
        time.sleep(1)
    keys = json.loads(secrets.get_secret_value(SecretId=SECRET)["SecretString"])["keys"]
    print(f"rotation under load: {dict(load.outcomes)} requests, {len(load.failures)} failed")
    assert load.failures == []
    assert load.outcomes["old"] > 0 and load.outcomes["new"] > 0
    assert len(keys) == 1 and keys[0] != OLD
    assert [_status(url, OLD) for url in runtimes] == [401, 401]
    assert [_status(url, keys[0]) for url in runtimes] == [200, 200]
    assert [step.fingerprint for step in rotation.steps] == [
        fingerprint_of([keys[0], OLD]),
        fingerprint_of(keys),
    ]
    assert rotation.retired == 1


def test_every_replica_is_shown_serving_each_new_set_and_no_key_is_printed(secrets, runtimes) -> None:
    lines: list[str] = []
    rotation = rotate(
        secrets, SECRET, _replicas(runtimes), wait_s=4 * RELOAD_S, overlap_s=0, progress=lines.append
    )
    new = json.loads(secrets.get_secret_value(SecretId=SECRET)["SecretString"])["keys"][0]
    assert [sorted(step.replicas) for step in rotation.steps] == [sorted(runtimes)] * 2
    assert all(
        f"{url}: serves {step.fingerprint}" in "\n".join(lines) for step in rotation.steps for url in runtimes
    )
    assert OLD not in "\n".join(lines) and new not in "\n".join(lines)


def test_a_replica_that_never_serves_the_new_set_stops_the_rotation_with_the_old_key_kept(
    secrets, runtimes
) -> None:
    silent = Replica("127.0.0.1:1", lambda: "")  # a runtime that never reports a key set
    with pytest.raises(RotationError, match=r"new key served: .*127\.0\.0\.1:1 \(none\)"):
        rotate(secrets, SECRET, [*_replicas(runtimes), silent], wait_s=RELOAD_S, overlap_s=RELOAD_S)
    keys = json.loads(secrets.get_secret_value(SecretId=SECRET)["SecretString"])["keys"]
    assert OLD in keys
    assert [_status(url, OLD) for url in runtimes] == [200, 200]


@pytest.mark.parametrize(
    ("wait_s", "overlap_s", "field"),
    [
        (60, 3, "--overlap-s 3: must be >= runtime.api_keys_reload_s (5)"),
        (2, 10, "--wait-s 2: must be >= runtime.api_keys_reload_s (5)"),
        (0, 10, "--wait-s 0: must be > 0"),
    ],
)
def test_timings_shorter_than_the_reload_interval_are_refused_naming_the_option(
    wait_s, overlap_s, field
) -> None:
    assert any(
        p.startswith(field) for p in timing_problems(wait_s, overlap_s, RELOAD_S, "runtime.api_keys_reload_s")
    )


def test_fab_keys_rotate_refuses_an_overlap_shorter_than_the_stack_reload_interval() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("fab")), "keys.rotate", "-s", "local", "--overlap-s", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--overlap-s 3: must be >= runtime.api_keys_reload_s (60)" in done.stderr


# --- fab keys.rotate on a stack of several pools: each pool's own secret ----------------------------


@pytest.fixture
def two_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The local stack as two pools (tests/gateway/stacks.py), the small one's runtimes reading their
    secret every 30 s, the first's every 60 s, the gateway every 20 s."""
    from frontier.project import STACKS_DIR_ENV
    from tests.gateway.stacks import two_model_config, write_stack

    document = two_model_config()
    document["config"]["frontier:models"][1]["runtime"]["api_keys_reload_s"] = 30
    document["config"]["frontier:gateway"]["keys_reload_s"] = 20
    path = write_stack(tmp_path, document)
    monkeypatch.setenv(STACKS_DIR_ENV, str(tmp_path))
    return path


def test_a_rotation_of_two_pools_rotates_each_pools_own_secret_or_the_named_ones_alone(two_pools) -> None:
    from frontier.cli.keys import _plans
    from frontier.targets import load_stack

    settings = load_stack("local", path=two_pools)
    every = _plans(settings, None, None, None)
    assert [(p.pool.name, p.secret_id) for p in every] == list(settings.api_keys_secrets.items())
    assert len({p.secret_id for p in every}) == 2
    (small,) = _plans(settings, "tiny-llama-small", None, None)
    assert (small.secret_id, small.overlap_s) == ("frontier/local/tiny-llama-small/api-keys", 60)


def test_fab_keys_rotate_refuses_an_unknown_model_naming_the_models_served(two_pools, capsys) -> None:
    from fab_program import fab

    code, _, err = fab(capsys, "keys.rotate", "-s", "local", "--model", "nope")
    assert code == 2
    assert (
        "--model: model 'nope' is not served by stack 'local': it serves tiny-llama, tiny-llama-small" in err
    )


def test_fab_keys_rotate_refuses_the_whole_rotation_when_one_pools_overlap_is_too_short(
    two_pools, capsys
) -> None:
    from fab_program import fab

    # 45 s is past the small pool's reload interval (30 s), short of the first pool's (60 s): nothing is rotated.
    code, _, err = fab(capsys, "keys.rotate", "-s", "local", "--overlap-s", "45")
    assert code == 2
    assert "model tiny-llama: --overlap-s 45: must be >= runtime.api_keys_reload_s (60)" in err
    assert "tiny-llama-small:" not in err
