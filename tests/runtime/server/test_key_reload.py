"""API keys without restarts: a runtime process reads its key secret again every
``api_keys_reload_s`` and at once on SIGHUP, swaps the whole set, and keeps the set in use when a
reload fails. Each test runs ``python -m frontier_runtime serve`` on a free loopback port, its keys
in moto's Secrets Manager server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from frontier_hostside import names
from frontier_runtime.server.auth import fingerprint_of
from server_harness import MODEL

SECRET = "frontier/test/reload-keys"
OLD = "sk-old-0123456789abcdef"
NEW = "sk-new-fedcba9876543210"
RELOAD_S = 5  # the shortest interval the setting allows
# A reload is due within RELOAD_S; the rest covers a busy machine's scheduling and the read itself.
WITHIN_S = RELOAD_S + 10


class Runtime:
    def __init__(self, root: Path, model_dir: Path, endpoint: str, reload_s: float) -> None:
        config = {
            "model": {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": 256},
            "api_keys_secret": SECRET,
            "api_keys_reload_s": reload_s,
            "max_concurrency": 4,
            "queue": {"max_length": 64, "timeout_ms": 30_000},
            "batch": {"window_ms": 0, "max_batch_size": 4, "max_num_batched_tokens": 512},
            "cpu_kv_cache_bytes": 16 * 1024 * 1024,
            "drain_timeout_s": 5,
            "device": "cpu",
            "cpu_threads": 1,
        }
        (root / "runtime.yaml").write_text(yaml.safe_dump(config))
        self.log = root / "runtime.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "frontier_runtime",
                "serve",
                "--config",
                "runtime.yaml",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            cwd=root,
            env={**os.environ, "AWS_ENDPOINT_URL": endpoint, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        self.url = f"http://127.0.0.1:{self._port()}"
        _until(lambda: httpx.get(self.url + "/health/ready", timeout=2).status_code == 200, 120, "ready")

    def _port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if '"event": "listening"' in line:
                    return int(json.loads(line)["port"])
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            time.sleep(0.1)
        raise AssertionError("the runtime never listened")

    def status(self, key: str) -> int:
        return httpx.get(
            self.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).status_code

    def metric(self, name: str) -> str:
        text = httpx.get(self.url + names.METRICS_PATH, timeout=10).text
        return "\n".join(line for line in text.splitlines() if line.startswith(name))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``check()`` holds; AssertionError naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if check():
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not {what} within {timeout} s")


def _put(keys: list[str]) -> None:
    boto3.client("secretsmanager").put_secret_value(SecretId=SECRET, SecretString=json.dumps({"keys": keys}))


@pytest.fixture
def start(aws_endpoint: str, tiny_model: Path, tmp_path: Path) -> Iterator[Callable[..., Runtime]]:
    boto3.client("secretsmanager").create_secret(Name=SECRET, SecretString=json.dumps({"keys": [OLD]}))
    started: list[Runtime] = []

    def _start(reload_s: float = RELOAD_S) -> Runtime:
        runtime = Runtime(tmp_path, tiny_model, aws_endpoint, reload_s)
        started.append(runtime)
        return runtime

    yield _start
    for runtime in started:
        runtime.stop()


def test_a_new_key_works_within_the_reload_interval_without_a_restart(start) -> None:
    runtime = start()
    assert runtime.status(NEW) == 401
    _put([NEW, OLD])
    _until(lambda: runtime.status(NEW) == 200, WITHIN_S, "the new key accepted")
    assert runtime.status(OLD) == 200
    assert runtime.proc.poll() is None


def test_sighup_reloads_the_keys_at_once(start) -> None:
    runtime = start(reload_s=3600)
    _put([NEW])
    runtime.proc.send_signal(signal.SIGHUP)
    _until(lambda: runtime.status(NEW) == 200, 10, "the new key accepted after SIGHUP")
    assert runtime.status(OLD) == 401
    assert runtime.proc.poll() is None


def test_a_revoked_key_is_refused_within_the_reload_interval(start) -> None:
    runtime = start()
    _put([NEW])
    _until(lambda: runtime.status(OLD) == 401, WITHIN_S, "the revoked key refused")
    assert runtime.status(NEW) == 200


def test_a_failed_reload_keeps_the_keys_in_use_and_is_counted(start) -> None:
    runtime = start(reload_s=3600)
    boto3.client("secretsmanager").put_secret_value(SecretId=SECRET, SecretString='{"keys": []}')
    runtime.proc.send_signal(signal.SIGHUP)
    failures = f"{names.API_KEYS_RELOAD_FAILURES_METRIC}_total 1.0"
    _until(lambda: failures in runtime.metric(names.API_KEYS_RELOAD_FAILURES_METRIC), 10, "a failure counted")
    assert runtime.status(OLD) == 200
    assert runtime.metric(names.API_KEYS_LOADED_METRIC) == f"{names.API_KEYS_LOADED_METRIC} 1.0"
    assert "api_keys_reload_failed" in runtime.log.read_text()


def test_metrics_name_the_key_set_by_fingerprint_never_by_key(start) -> None:
    runtime = start(reload_s=3600)
    _put([NEW, OLD])
    runtime.proc.send_signal(signal.SIGHUP)
    expected = (
        f'{names.API_KEYS_INFO_METRIC}{{{names.KEYS_FINGERPRINT_LABEL}="{fingerprint_of([OLD, NEW])}"}} 1.0'
    )
    _until(lambda: runtime.metric(names.API_KEYS_INFO_METRIC) == expected, 10, "the new set's fingerprint")
    text = httpx.get(runtime.url + names.METRICS_PATH, timeout=10).text + runtime.log.read_text()
    assert OLD not in text and NEW not in text
