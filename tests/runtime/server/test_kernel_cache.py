"""Compiled GPU kernels kept in S3 beside the weights version (storage/kernel_cache.py): the first
host of a kind publishes what it compiled once ready, the next restores it before its engine is
built and Triton compiles none of it again.

Real: Triton's compiler and cache — a kernel compiled for an H100 (sm_90: Triton's own LLVM and
ptxas, which need no GPU) by a fresh process pointed at the start's directory, as a GPU host's
warm-up compiles into it —, the runtime's start (``load_runtime``, the engine, its warm-up and what
runs once ready), the archive in S3 (moto). Not run here: the engine's own kernels compiling on a
GPU during its warm-up, which is where a GPU host fills the directory (no GPU in CI)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_runtime.config import RuntimeConfig, parse_config
from frontier_runtime.server import serve, warm_start
from frontier_runtime.storage import kernel_cache
from moto import mock_aws
from server_harness import push_weights, weights_start_document

BUCKET = "frontier-kernels"
SOURCE = f"s3://{BUCKET}/tiny"

# A GPU host's warm-up, in its own process: Triton compiles a kernel for sm_90 into TRITON_CACHE_DIR
# (the directory the start pointed it at) and says how long the compile took.
COMPILE = """
import json, os, sys, time
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget

@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

source = triton.compiler.ASTSource(
    fn=matmul,
    signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
               "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
    constexprs={"BM": 128, "BN": 128, "BK": 64},
)
target = GPUTarget("cuda", 90, 32)
# Once per process, hit or miss: Triton's own identity (a hash of its library) and the backend's
# (it asks ptxas its version). Not timed.
triton.runtime.cache.triton_key()
triton.compiler.compiler.make_backend(target).hash()
started = time.monotonic()
kernel = triton.compile(source, target=target, options={"num_warps": 8, "num_stages": 3})
print(json.dumps({"seconds": time.monotonic() - started, "cubin": len(kernel.asm["cubin"])}))
"""


def compile_on_host(directory: Path) -> dict:
    env = {**os.environ, kernel_cache.TRITON_CACHE_ENV: str(directory), "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    script = directory.parent / "warmup.py"  # Triton reads a kernel's source from its file
    script.write_text(COMPILE)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _config(cache_dir: Path) -> RuntimeConfig:
    return parse_config(yaml.safe_dump(weights_start_document(SOURCE, cache_dir)))


@pytest.fixture
def s3(tiny_model: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The tiny model's weights version in moto's S3; Triton's directory put back afterwards."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv(kernel_cache.TRITON_CACHE_ENV, raising=False)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        push_weights(client, tiny_model, BUCKET)
        yield client


def _kept(client) -> list[str]:  # noqa: ANN001
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"tiny/v1/{kernel_cache.KERNELS_DIR}/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_the_first_host_of_a_kind_keeps_what_it_compiled_and_the_next_compiles_none_of_it(s3, tmp_path):
    first = warm_start.kernels(_config(tmp_path / "host-a"))
    assert first.restored == frozenset() and os.environ[kernel_cache.TRITON_CACHE_ENV] == str(first.directory)
    cold = compile_on_host(first.directory)
    compiled = kernel_cache.entries(first.directory)
    assert compiled and first.publish() == len(compiled)
    assert _kept(s3) == [f"tiny/v1/kernels/{first.key}.tar"]

    second = warm_start.kernels(_config(tmp_path / "host-b"))
    assert second.key == first.key and second.restored == compiled
    warm = compile_on_host(second.directory)
    assert kernel_cache.entries(second.directory) == compiled  # Triton found every entry
    assert warm["cubin"] == cold["cubin"]
    print(f"\nsm_90 kernel: compiled in {cold['seconds']:.3f} s, from the restored cache in {warm['seconds']:.4f} s")
    assert warm["seconds"] < cold["seconds"] / 5
    assert second.publish() == 0  # nothing new: no second upload


def test_a_start_keeps_its_kernels_once_ready_and_the_next_start_restores_them(s3, tmp_path):
    # The start a server makes, in order: weights, Triton's directory, engine, warm-up, then what
    # runs once ready. A GPU's warm-up would compile into the directory; here a process does.
    loaded = serve.load_runtime(_config(tmp_path / "host-a"), None)
    try:
        compile_on_host(Path(os.environ[kernel_cache.TRITON_CACHE_ENV]))
        loaded.engine.warmup()
        assert loaded.after_ready is not None
        loaded.after_ready()
    finally:
        loaded.engine.shutdown()
    [kept] = _kept(s3)
    with tarfile.open(fileobj=io.BytesIO(s3.get_object(Bucket=BUCKET, Key=kept)["Body"].read())) as tar:
        names = tar.getnames()
    assert any(name.endswith(".cubin") for name in names)
    # A spare warmed on a rebalance recommendation gets them with the weights.
    assert warm_start.prefetch(_config(tmp_path / "host-b"))["kernel_files"] == len(names)


def test_a_cpu_start_that_compiled_nothing_uploads_nothing(s3, tmp_path):
    loaded = serve.load_runtime(_config(tmp_path / "host-a"), None)
    try:
        loaded.engine.warmup()
        assert loaded.after_ready is not None
        loaded.after_ready()
    finally:
        loaded.engine.shutdown()
    assert _kept(s3) == []


def test_an_archive_reaching_outside_its_directory_is_refused_and_the_start_goes_on(s3, tmp_path):
    key = kernel_cache.cache_key(warm_start.engine_spec(_config(tmp_path / "host-a")))
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w") as tar:
        escaping = tarfile.TarInfo("../../outside.txt")
        escaping.size = 3
        tar.addfile(escaping, io.BytesIO(b"bad"))
    s3.put_object(Bucket=BUCKET, Key=f"tiny/v1/kernels/{key}.tar", Body=body.getvalue())
    cache = warm_start.kernels(_config(tmp_path / "host-a"))
    assert cache.restored == frozenset() and kernel_cache.entries(cache.directory) == frozenset()
    assert not list(tmp_path.rglob("outside.txt"))


def test_an_unreadable_bucket_costs_the_start_nothing_but_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(kernel_cache.TRITON_CACHE_ENV, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    started = time.monotonic()
    cache = warm_start.kernels(_config(tmp_path / "host-a"))
    assert cache.restored == frozenset() and cache.directory.is_dir()
    assert time.monotonic() - started < 30
