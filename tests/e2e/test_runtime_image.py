"""The runtime image: runtime/Dockerfile built with podman and run the way a GPU host's unit runs it.

The CPU variant is the production Dockerfile on another base: a root file system from Debian's
packages with no compiler and no headers, as a CUDA runtime image has none, and a local apt
repository of what the Dockerfile installs (scripts/build-debian-base.sh; no registry can be pulled
from here), every wheel of the CPU variant's lock (requirements/image-cpu.txt, installed with
--require-hashes) from a local wheelhouse that the host's pip fills from that lock (torch's CPU wheel
lies on local disk), and the build runs with no network at all. The container runs with the flags and mounts
of the unit that templates/frontier-runtime.service.j2 renders, read out of its ExecStart (see
_unit_run for the little that changes): uid 10001, a read-only root, /tmp and the JIT cache on
tmpfs, the release read-only, the weights cache bind-mounted writable; the runtime fetches the
weights from S3 (moto's server on loopback, over the host network) into that cache, verifies them
and serves. Inside it, what Triton needs at first use on a GPU: a C compiler found as Triton finds
one, Python.h, and a cache folder per variable that takes and loads what was built.

The first run on a machine pays for the base and the image (see docs/runtime.md, "The image"); both
stay in podman's store under tags derived from their content, so later runs only start containers.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_hostside.names import (
    CLOUD_WEIGHTS_CACHE,
    CURRENT_LINK,
    HOST_ROOT,
    JIT_CACHE_DIR,
    JIT_CACHE_ENV,
    PLACEHOLDER_DIGEST,
    READINESS_PATH,
    RUNTIME_UID,
    UNIT_NAME,
)
from frontier_runtime.config import parse_config
from moto.server import ThreadedMotoServer

from frontier import project
from frontier.release import weights
from frontier.release.artifact import PODMAN_BUILD_FORMAT, build_image
from frontier.render.boot import render_mount_cache
from frontier.render.stack import render_stack
from frontier.targets import load_stack

# A cold run builds the base (~1.5 min) and the image (several minutes on two cores) inside the
# first test's setup.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = project.root()
# $FRONTIER_RUNTIME_DIR builds another checkout of the runtime, as fab release.build does.
CONTEXT = project.runtime_dir()
HOSTSIDE = project.hostside_dir()
# What the Dockerfile copies from the hostside build context.
HOSTSIDE_COPIED = ("pyproject.toml", "frontier_hostside", "frontier_settings")
BASE_SCRIPT = REPO / "scripts" / "build-debian-base.sh"
LOCKS = REPO / "requirements"
# The CPU variant's lock (scripts/lock.sh): CPython 3.11 as on the Debian base, torch's CPU wheel.
CPU_LOCK = "image-cpu.txt"
IMAGE_REPOSITORY = "localhost/frontier-runtime"
# podman's global flags in this sandbox: crun cannot run with cgroups in hybrid mode, runc can.
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager=cgroupfs")
# `podman run` flags this sandbox needs and a GPU host does not: raising rlimits above the current
# ones is refused, and no CNI plugins are installed (the unit runs with --network host anyway).
SANDBOX_RUN_FLAGS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "host")
# The stack whose rendered unit the container runs with: local's serving group is CPU, so its unit
# has every flag a GPU host's has but --gpus all, --ipc=host and the memlock and stack ulimits
# (which need a GPU host, and raising rlimits is refused here).
UNIT_STACK = "local"
MODEL = "tiny-image"
TINY_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}
BUCKET = "frontier-image-test"
READY_TIMEOUT_S = 180.0


# --- the image ------------------------------------------------------------------------------------


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run scripts/system-packages.sh (make system-packages)")
    result = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(
            f"podman {' '.join(args[:2])} failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
        )
    return result


def _wheelhouse() -> Path:
    """Every wheel of the CPU lock, downloaded once per lock by the host's pip (its configuration
    knows where torch's CPU wheel is), each checked against the lock's hashes; the image build
    mounts this folder and reaches nothing else, and checks each hash again as it installs."""
    lock = LOCKS / CPU_LOCK
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    house = project.state_dir() / "wheelhouse" / key
    if (house / ".complete").exists():
        return house
    partial = house.with_name(f".{key}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(partial),
        "--require-hashes", "--no-deps", "-r", str(lock),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.fail(f"pip download of the image's wheels failed:\n{result.stderr[-3000:]}")
    (partial / ".complete").write_text(f"{CPU_LOCK} {key}\n")
    shutil.rmtree(house, ignore_errors=True)
    partial.rename(house)
    return house


@dataclass(frozen=True)
class DebianBase:
    image: str
    # The local apt repository of every package the Dockerfile installs with apt: the base's only
    # apt source, mounted into the build at /debs.
    repository: Path


def _debian_base() -> DebianBase:
    """The local base image (no compiler, no headers: what the runtime stage needs of those it must
    install, as on a CUDA runtime base) and its package repository, built from Debian's packages the
    first time on this machine."""
    result = subprocess.run(
        ["bash", str(BASE_SCRIPT)],
        env={**os.environ, "DOCKERFILE": str(CONTEXT / "Dockerfile")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        pytest.fail(f"{BASE_SCRIPT.name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    repository, image = result.stdout.strip().splitlines()[-2:]
    return DebianBase(image, Path(repository))


def _ignored(rel: Path, patterns: list[str]) -> bool:
    """.dockerignore's patterns as this project writes them: a path from the context's root, or
    `**/` + a name matched at any depth; a match on a folder leaves out everything in it."""
    for depth in range(1, len(rel.parts) + 1):
        prefix = "/".join(rel.parts[:depth])
        for pattern in patterns:
            if pattern.startswith("**/") and fnmatch.fnmatchcase(rel.parts[depth - 1], pattern[3:]):
                return True
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
    return False


def _context_digest() -> str:
    """sha256 of what the build reads: the Dockerfile and the runtime context as .dockerignore
    leaves it, the parts of the hostside context the Dockerfile copies (build leftovers out), and the
    lock it installs from."""
    ignore = CONTEXT / ".dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip()[:1] not in ("", "#")]
    files = [("Dockerfile", CONTEXT / "Dockerfile"), (f"requirements/{CPU_LOCK}", LOCKS / CPU_LOCK)]
    files += [
        (f"runtime/{path.relative_to(CONTEXT)}", path)
        for path in CONTEXT.rglob("*")
        if path.is_file() and not _ignored(path.relative_to(CONTEXT), patterns)
    ]
    for copied in HOSTSIDE_COPIED:
        top = HOSTSIDE / copied
        for path in [top] if top.is_file() else top.rglob("*"):
            if path.is_file() and not _ignored(path.relative_to(HOSTSIDE), ["**/__pycache__", "**/*.pyc"]):
                files.append((f"hostside/{path.relative_to(HOSTSIDE)}", path))
    digest = hashlib.sha256()
    for name, path in sorted(files):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Image:
    ref: str


@pytest.fixture(scope="module")
def image() -> Image:
    """The CPU image, tagged by a hash of everything it is built from: the build contexts (the
    runtime's and the host side's sources, the Dockerfile among them), the base image's id and the
    wheel set. An unchanged checkout finds it in podman's store and builds nothing."""
    wheelhouse = _wheelhouse()
    base = _debian_base()
    base_id = _podman("image", "inspect", "--format", "{{.Id}}", base.image).stdout.strip()
    # No EFA userspace: the CPU variant has neither the devices nor a network to fetch it with.
    build_args = {
        "CUDA_IMAGE": base.image,
        "IMAGE_LOCK": CPU_LOCK,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "/wheelhouse",
        "EFA_INSTALLER_VERSION": "",
    }
    content = json.dumps(
        [_context_digest(), base_id, base.repository.name, wheelhouse.name, build_args], sort_keys=True
    )
    ref = f"{IMAGE_REPOSITORY}:cpu-{hashlib.sha256(content.encode()).hexdigest()[:12]}"
    if _podman("image", "exists", ref, check=False).returncode == 0:
        return Image(ref)
    _podman(
        "build", *PODMAN_BUILD_FORMAT,  # docker's format keeps the HEALTHCHECK (OCI has none)
        "--network", "none",  # everything comes from the base and the wheelhouse
        "--build-context", f"hostside={HOSTSIDE}",
        "--build-context", f"requirements={LOCKS}",
        *(arg for name, value in build_args.items() for arg in ("--build-arg", f"{name}={value}")),
        "--volume", f"{wheelhouse}:/wheelhouse:ro",
        "--volume", f"{base.repository}:/debs:ro",
        "--tag", ref, str(CONTEXT),
        timeout=1500,
    )  # fmt: skip
    _remove_other_builds(keep=ref)
    return Image(ref)


def _remove_other_builds(keep: str) -> None:
    """Earlier builds' tags go (each holds a few hundred MB of its own layers), so podman's store on
    a CI machine keeps one runtime image and the builder's layer cache, not one image per commit.
    One a container still uses stays: rmi without --force refuses it."""
    listed = _podman(
        "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference={IMAGE_REPOSITORY}"
    )
    for ref in listed.stdout.split():
        if ref != keep and ref.startswith(f"{IMAGE_REPOSITORY}:cpu-"):
            _podman("rmi", ref, check=False)


# --- what a host gives the container: the weights in S3, the release, the cache ------------------


@dataclass(frozen=True)
class Weights:
    endpoint: str
    uri: str
    version: str


@pytest.fixture(scope="module")
def s3_weights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Weights]:
    """A tiny random checkpoint pushed with its sha256 manifest to moto's S3 on loopback."""
    from frontier_runtime.tiny import make_tiny_checkpoint

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        model = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0, **TINY_SHAPE)
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        uri, version = f"s3://{BUCKET}/{MODEL}", "v1"
        weights.push(s3, model, uri, MODEL, version, create_bucket=True)
        yield Weights(endpoint, uri, version)
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _release(root: Path, weights_: Weights, port: int, cache: str = CLOUD_WEIGHTS_CACHE) -> Path:
    """A release directory with the runtime.yaml the runtime reads (checked by the runtime's own
    parser before it starts)."""
    config = {
        "model": {
            "name": MODEL,
            "weights_uri": weights_.uri,
            "version": weights_.version,
            "max_seq_len": 256,
        },
        "host": "127.0.0.1",
        "port": port,
        "device": "cpu",
        "max_concurrency": 4,
        "batch": {"window_ms": 0, "max_batch_size": 4, "max_num_batched_tokens": 512},
        "cpu_kv_cache_bytes": 16 * 1024 * 1024,
        "block_size": 16,
        "weights_cache_dir": cache,
        "json_logs": False,
    }
    text = yaml.safe_dump(config, sort_keys=False)
    parse_config(text)
    release = root / "release"
    release.mkdir()
    (release / "runtime.yaml").write_text(text)
    return release


def _bootstrap_cache(root: Path) -> Path:
    """The weights cache prepared by the host's own mount-cache.sh (rendered for prod's serving group)
    on an already mounted cache volume: the script's job is then to make the runtime's uid own it.
    `mountpoint` and `findmnt` are shims (there is no volume to mount here); mkdir and chown are real."""
    settings = load_stack("prod")
    script = root / "mount-cache.sh"
    script.write_text(render_mount_cache(settings, settings.serving_group))
    shims = root / "bin"
    shims.mkdir()
    for name, body in {"mountpoint": '[ "$2" = /var/cache/frontier ]', "findmnt": "echo /dev/md127"}.items():
        (shims / name).write_text(f"#!/bin/sh\n{body}\n")
        (shims / name).chmod(0o755)
    host = root / "host"
    env = {"PATH": f"{shims}:/usr/sbin:/usr/bin:/sbin:/bin", "FRONTIER_CACHE_ROOT": str(host)}
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return host / CLOUD_WEIGHTS_CACHE.lstrip("/")


def _root_owned_cache(root: Path) -> Path:
    """A cache directory as a host without the bootstrap's chown leaves it: root's, mode 0755."""
    cache = root / "root-owned-cache"
    cache.mkdir(mode=0o755)
    assert cache.stat().st_uid == 0, "the test runs as root, like the host's boot scripts"
    return cache


# --- the container, run as the unit runs it ------------------------------------------------------


@dataclass
class Container:
    name: str
    url: str
    cache: Path

    def logs(self) -> str:
        result = _podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def running(self) -> bool:
        state = _podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return state.stdout.strip() == "true"

    def exit_code(self, timeout_s: float) -> int:
        result = _podman("wait", self.name, timeout=timeout_s)
        return int(result.stdout.strip().splitlines()[-1])


def _unit_exec_start() -> tuple[dict[str, str], list[str]]:
    """The rendered unit's Environment= and its ExecStart as argv (continuation lines joined, split
    as systemd splits them). Rendered for UNIT_STACK as `fab render` renders it."""
    unit = render_stack(load_stack(UNIT_STACK), PLACEHOLDER_DIGEST)[f"release/{UNIT_NAME}"]
    lines = unit.replace("\\\n", " ").splitlines()
    environment = dict(
        line.removeprefix("Environment=").split("=", 1) for line in lines if line.startswith("Environment=")
    )
    (exec_start,) = [line.removeprefix("ExecStart=") for line in lines if line.startswith("ExecStart=")]
    return environment, shlex.split(exec_start)


def _unit_run(name: str, image: Image, binds: dict[str, Path], extra_env: dict[str, str]) -> list[str]:
    """The unit's `docker run` as this sandbox runs it. Every flag, mount and the command pass
    through as rendered; what changes, and why:
    - /usr/bin/docker becomes podman with this sandbox's global and run flags (PODMAN,
      SANDBOX_RUN_FLAGS, the latter only where the unit does not already pass them);
    - ${FRONTIER_IMAGE} is expanded from the unit's Environment= (systemd does it there) and then
      names the image built here (the unit names a registry digest);
    - --name gets this test's name, and --rm gives way to --detach (systemd keeps docker run in the
      foreground and lets --rm clean up; a test reads the logs of a container that exited, then
      removes it);
    - each bind mount's source, a host path (the release's current link, the weights cache), is
      this test's folder for it: one the test has no folder for fails;
    - extra_env (moto's endpoint and keys: a host's instance profile gives real ones) goes before
      the image."""
    environment, argv = _unit_exec_start()
    assert argv[:2] == ["/usr/bin/docker", "run"], argv[:2]
    image_at = argv.index("${FRONTIER_IMAGE}")
    assert environment["FRONTIER_IMAGE"].endswith(f"@{PLACEHOLDER_DIGEST}"), environment
    flags, command = argv[2:image_at], argv[image_at + 1 :]
    out: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag == "--rm":
            i += 1
            continue
        if flag == "--name":
            out += ["--name", name]
            i += 2
            continue
        if flag == "--mount" and "type=bind" in flags[i + 1]:
            fields = dict(
                field.split("=", 1) if "=" in field else (field, "") for field in flags[i + 1].split(",")
            )
            source = fields["source"]
            if source not in binds:
                pytest.fail(f"the unit bind-mounts {source}, for which this test has no folder")
            fields["source"] = str(binds[source])
            out += ["--mount", ",".join(f"{k}={v}" if v else k for k, v in fields.items())]
            i += 2
            continue
        out.append(flag)
        i += 1
    sandbox = list(SANDBOX_RUN_FLAGS)
    if "--network" in out:  # the unit's own --network host
        at = sandbox.index("--network")
        del sandbox[at : at + 2]
    env = [arg for key, value in extra_env.items() for arg in ("--env", f"{key}={value}")]
    return ["run", "--detach", *sandbox, *out, *env, image.ref, *command]


def _start(image: Image, weights_: Weights, root: Path, cache: Path, name: str) -> Container:
    port = _free_port()
    release = _release(root, weights_, port)
    binds = {f"{HOST_ROOT}/{CURRENT_LINK}": release, CLOUD_WEIGHTS_CACHE: cache}
    moto = {
        "AWS_ENDPOINT_URL": weights_.endpoint,
        # moto's server takes any key; a host's instance profile gives real ones.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    _podman(*_unit_run(name, image, binds, moto))
    return Container(name, f"http://127.0.0.1:{port}", cache)


def _remove(container: Container) -> None:
    _podman("rm", "--force", "--time", "5", container.name, check=False)


def _wait_ready(url: str, running: Callable[[], bool], logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}{READINESS_PATH}", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if not running():
            pytest.fail(f"the runtime exited before it was ready:\n{logs()[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"not ready after {READY_TIMEOUT_S:.0f} s:\n{logs()[-4000:]}")


@pytest.fixture(scope="module")
def served(
    image: Image, s3_weights: Weights, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Container]:
    """The image serving, on a cache the bootstrap prepared."""
    root = tmp_path_factory.mktemp("served")
    container = _start(image, s3_weights, root, _bootstrap_cache(root), f"frontier-image-test-{os.getpid()}")
    try:
        _wait_ready(container.url, container.running, container.logs)
        yield container
    finally:
        _remove(container)


@pytest.fixture(scope="module")
def served_here(s3_weights: Weights, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same release served by this checkout's runtime as a plain process, the way the local
    stack runs it: the yardstick for what the image serves."""
    root = tmp_path_factory.mktemp("here")
    port = _free_port()
    release = _release(root, s3_weights, port, cache=str(root / "cache"))
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3_weights.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    log = root / "runtime.log"
    with log.open("w") as out:
        command = [
            sys.executable,
            "-m",
            "frontier_runtime",
            "serve",
            "--config",
            str(release / "runtime.yaml"),
        ]
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", lambda: process.poll() is None, log.read_text)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=60)


def _chat(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        return json.loads(response.read())


# --- the behaviours --------------------------------------------------------------------------------


GREEDY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "the model serves a token"}],
    "max_tokens": 8,
    "temperature": 0,
    "ignore_eos": True,
}


def test_the_image_serves_a_chat_completion_as_uid_10001_on_a_read_only_root(served: Container) -> None:
    answer = _chat(served.url, GREEDY)
    assert answer["object"] == "chat.completion" and answer["model"] == MODEL
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["finish_reason"] == "length"
    assert isinstance(answer["choices"][0]["message"]["content"], str)


def test_the_image_answers_what_this_checkout_answers(served: Container, served_here: str) -> None:
    """The same weights, the same greedy request: the image runs these very sources on the same torch."""
    image, here = _chat(served.url, GREEDY), _chat(served_here, GREEDY)
    assert image["choices"][0]["message"] == here["choices"][0]["message"]
    # Token counts only: the image has served this prompt before, so its prefix cache hits.
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [image["usage"][k] for k in counts] == [here["usage"][k] for k in counts]


def test_the_weights_are_fetched_into_the_cache_mount_and_owned_by_the_runtime_uid(served: Container) -> None:
    fetched = [path for path in served.cache.rglob("*") if path.is_file()]
    assert any(path.name.endswith(".safetensors") for path in fetched), fetched
    assert {path.stat().st_uid for path in fetched} == {RUNTIME_UID}


def test_the_health_check_of_the_image_is_the_runtime_probe_and_passes(
    served: Container, image: Image
) -> None:
    check = json.loads(_podman("image", "inspect", image.ref).stdout)[0]["Healthcheck"]
    assert check["Test"][-4:] == ["python", "-m", "frontier_runtime", "probe"]
    probe = _podman("exec", served.name, *check["Test"][1:], check=False)
    assert probe.returncode == 0, probe.stderr


# --- what Triton and inductor need at first use, checked inside the served container -------------

# Run in the container (`podman exec`, so with the unit's user, mounts and environment) and, for its
# lookup alone, here against Triton's own code. Triton is not in the CPU image (the CPU torch wheel
# does not depend on it; the CUDA one does), so the probe reproduces what Triton does at first use
# (triton/runtime/build.py, 3.x): _find_compiler("c"), _build's command line and include folder, and
# _compile_so's build in a temporary folder, put into the cache folder, loaded from there. Where
# Triton is importable it uses Triton's own lookup instead, and says which it used.
PROBE = r"""
import errno, importlib.util, json, os, shutil, subprocess, sys, sysconfig, tempfile


def find_c_compiler(environ, which):
    # Triton's _find_compiler("c"): $CC as given, else gcc on PATH, else clang (None: Triton raises).
    cc = environ.get("CC")
    if cc is not None:
        return cc
    gcc, clang = which("gcc"), which("clang")
    return gcc if gcc is not None else clang


def python_include():
    # _build's folder for Python.h: the default scheme's, posix_prefix for Debian's posix_local.
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


SOURCE = '''
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
'''


def build_and_load(cc, folder, name):
    # _compile_so: _build in a temporary folder (under TMPDIR), the bytes put into the cache folder
    # (a temporary name, then renamed, as its cache manager does), the module loaded from there.
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    with tempfile.TemporaryDirectory() as tmp:
        src, so = os.path.join(tmp, "main.c"), os.path.join(tmp, name + suffix)
        with open(src, "w") as f:
            f.write(SOURCE.replace("NAME", name))
        command = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, "-I" + tmp, "-I" + python_include()]
        built = subprocess.run(command, capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(built.stderr[-2000:])
        with open(so, "rb") as f:
            data = f.read()
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    target = os.path.join(folder, name, name + suffix)
    with open(target + ".tmp", "wb") as f:
        f.write(data)
    os.replace(target + ".tmp", target)
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.answer()


def attempt(function, *args):
    try:
        return {"answer": function(*args)}
    except Exception as exc:
        return {"error": type(exc).__name__ + ": " + str(exc)}


def mount_of(path):
    # The mount holding path (the deepest mount point at or above it): point, type, options.
    best = None
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, kind, options = line.split()[:4]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and (best is None or len(point) >= len(best[0])):
                best = (point, kind, options.split(","))
    return best


def write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "written"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def main(variables):
    out = {}
    try:
        from triton.runtime.build import _find_compiler
    except ImportError:
        out["lookup"], cc = "reproduced", find_c_compiler(os.environ, shutil.which)
    else:
        out["lookup"], cc = "triton", _find_compiler("c")
    out["cc"] = cc
    out["include"], out["sysconfig_include"] = python_include(), sysconfig.get_paths()["include"]
    out["python_h"] = os.path.isfile(os.path.join(out["include"], "Python.h"))
    out["caches"] = {}
    for i, variable in enumerate(variables):
        folder = os.environ.get(variable)
        built = attempt(build_and_load, cc, folder, "probe_cache_%d" % i)
        out["caches"][variable] = {"path": folder, "mount": mount_of(folder), **built}
    out["root"] = {path: write(path) for path in ("/usr/frontier-probe", os.path.expanduser("~/frontier-probe"))}
    print(json.dumps(out))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
"""


def _probe_functions() -> dict:
    namespace: dict = {"__name__": "probe"}
    exec(compile(PROBE, "probe", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def jit_probe(served: Container) -> dict:
    variables = json.dumps([name for name, _ in JIT_CACHE_ENV])
    result = _podman("exec", served.name, "python", "-c", PROBE, variables, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_probes_compiler_lookup_is_tritons(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Pins the reproduction to Triton's own _find_compiler (this venv's Triton), for $CC set, gcc
    and clang alone or together, cc (which Triton never looks for), and none."""
    from triton.runtime import build

    find_c_compiler = _probe_functions()["find_c_compiler"]
    folders = []
    for tools in [(), ("gcc",), ("clang",), ("gcc", "clang"), ("cc", "clang"), ("cc",)]:
        folder = tmp_path / ("-".join(tools) or "none")
        folder.mkdir()
        for tool in tools:
            (folder / tool).write_text("#!/bin/sh\n")
            (folder / tool).chmod(0o755)
        folders.append(folder)
    cases = [({"CC": "/opt/cc/bin/my-cc"}, folders[3])] + [({}, folder) for folder in folders]
    try:
        for env, folder in cases:
            monkeypatch.delenv("CC", raising=False)
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            monkeypatch.setenv("PATH", str(folder))
            build._find_compiler.cache_clear()
            try:
                tritons = build._find_compiler("c")
            except RuntimeError:  # Triton's "Failed to find C compiler"
                tritons = None
            assert find_c_compiler(os.environ, shutil.which) == tritons, (env, folder.name)
    finally:
        build._find_compiler.cache_clear()


def test_a_c_compiler_is_found_the_way_triton_looks_for_one(jit_probe: dict) -> None:
    # The CPU image has no Triton (see PROBE); a GPU image's Triton looks the same way.
    assert jit_probe["lookup"] == "reproduced"
    assert jit_probe["cc"] == "/usr/bin/gcc", jit_probe


def test_python_h_is_where_sysconfig_puts_the_include_folder(jit_probe: dict) -> None:
    assert jit_probe["include"] == jit_probe["sysconfig_include"]
    assert jit_probe["python_h"], f"no Python.h in {jit_probe['include']}"


def test_each_jit_cache_is_writable_and_loads_what_triton_builds_there(jit_probe: dict) -> None:
    """For each variable, as Triton's driver does: built with the found compiler against Python.h,
    put into the folder the variable names, loaded from there (which needs exec on that mount)."""
    for variable, folder in JIT_CACHE_ENV:
        cache = jit_probe["caches"][variable]
        assert cache["path"] == folder and folder.startswith(f"{JIT_CACHE_DIR}/"), (variable, cache)
        assert cache.get("answer") == 42, (variable, cache)


def test_the_jit_caches_are_on_the_units_tmpfs_without_noexec(jit_probe: dict) -> None:
    """Each folder lies on the unit's own tmpfs for them, nosuid and nodev but not noexec (docker's
    --tmpfs adds noexec unless the flag says exec; test_render checks that the unit says it)."""
    for variable, _ in JIT_CACHE_ENV:
        point, kind, options = jit_probe["caches"][variable]["mount"]
        assert (point, kind) == (JIT_CACHE_DIR, "tmpfs"), variable
        assert {"rw", "nosuid", "nodev"} <= set(options) and "noexec" not in options, options


def test_the_root_file_system_refuses_writes_with_erofs(jit_probe: dict) -> None:
    """Under the unit's --read-only, /usr and the runtime's home (where ~/.triton and ~/.nv would
    go) refuse a write."""
    assert jit_probe["root"] == {"/usr/frontier-probe": "EROFS", "/var/lib/frontier/frontier-probe": "EROFS"}


def test_a_root_owned_weights_cache_is_refused_with_eacces(
    image: Image, s3_weights: Weights, tmp_path: Path
) -> None:
    """What a GPU host without the bootstrap's chown hits: the runtime (uid 10001) cannot create the
    weights directory in root's cache, and exits naming the path."""
    container = _start(
        image, s3_weights, tmp_path, _root_owned_cache(tmp_path), f"frontier-image-eacces-{os.getpid()}"
    )
    try:
        assert container.exit_code(timeout_s=READY_TIMEOUT_S) != 0
        logs = container.logs()
        assert "[Errno 13] Permission denied" in logs and CLOUD_WEIGHTS_CACHE in logs, logs[-4000:]
        assert not any(container.cache.iterdir())
    finally:
        _remove(container)


def test_the_image_runs_as_uid_10001_unless_told_otherwise(image: Image) -> None:
    result = _podman("run", "--rm", *SANDBOX_RUN_FLAGS, image.ref, "id", "-u")
    assert result.stdout.strip() == str(RUNTIME_UID)


def test_the_root_file_system_refuses_writes_only_under_read_only(image: Image) -> None:
    """The runtime's own home is writable in the image; the unit's --read-only is what closes it."""
    write = ["python", "-c", "open('/var/lib/frontier/written', 'w').write('x')"]
    writable = _podman("run", "--rm", *SANDBOX_RUN_FLAGS, image.ref, *write, check=False)
    assert writable.returncode == 0, writable.stderr
    closed = _podman("run", "--rm", *SANDBOX_RUN_FLAGS, "--read-only", image.ref, *write, check=False)
    assert closed.returncode != 0 and "Read-only file system" in closed.stderr


def _healthcheck_context(root: Path) -> Path:
    """The smallest Dockerfile with a HEALTHCHECK: nothing to pull, nothing to run."""
    root.mkdir()
    (root / "Dockerfile").write_text('FROM scratch\nHEALTHCHECK CMD ["/probe"]\nCMD ["/probe"]\n')
    return root


def _healthcheck(ref: str) -> object:
    return json.loads(_podman("image", "inspect", ref).stdout)[0].get("Healthcheck")


def test_podman_drops_the_healthcheck_from_an_oci_image(tmp_path: Path) -> None:
    """podman's default image format is OCI, which has no health check: the provider behaviour that
    image.build's --format docker answers."""
    ref = f"localhost/frontier-healthcheck-test:oci-{os.getpid()}"
    _podman("build", "--quiet", "--tag", ref, str(_healthcheck_context(tmp_path / "context")))
    try:
        assert _healthcheck(ref) is None
    finally:
        _podman("rmi", ref, check=False)


def test_image_build_with_podman_keeps_the_healthcheck(tmp_path: Path) -> None:
    """fab image.build's own build (docker is absent here, so it drives podman)."""
    repository, tag = "localhost/frontier-healthcheck-test", f"fab-{os.getpid()}"
    context = _healthcheck_context(tmp_path / "context")
    build_image(repository, tag, context=context, hostside_dir=context)
    try:
        assert _healthcheck(f"{repository}:{tag}") == {"Test": ["CMD", "/probe"]}
    finally:
        _podman("rmi", f"{repository}:{tag}", check=False)


def _saved_config(image_id: str, folder: Path) -> dict:
    """The image's config as its bytes are stored (its sha256 is the image id), from podman save."""
    archive = folder / f"{image_id[:12]}.tar"
    _podman("save", "--format", "docker-archive", "--output", str(archive), image_id)
    with tarfile.open(archive) as saved:
        [manifest] = json.load(saved.extractfile("manifest.json"))  # type: ignore[arg-type]
        return json.load(saved.extractfile(manifest["Config"]))  # type: ignore[arg-type]


# What podman 4.3's docker-format config records of the build itself: the build container's id and
# hostname, the intermediate image each step started from. The OCI format has none of these (two
# builds give one image id there) but drops HEALTHCHECK.
PODMAN_BUILD_FIELDS = ("container", "parent")
PODMAN_BUILD_CONFIG_FIELDS = ("Hostname",)


def _without_build_fields(config: dict) -> dict:
    config = {k: v for k, v in config.items() if k not in PODMAN_BUILD_FIELDS}
    for section in ("config", "container_config"):
        config[section] = {k: v for k, v in config[section].items() if k not in PODMAN_BUILD_CONFIG_FIELDS}
    config["history"] = [{k: v for k, v in h.items() if k != "comment"} for h in config["history"]]
    return config


def test_two_image_builds_of_one_context_by_fab_image_build_give_the_same_layers(tmp_path: Path) -> None:
    """fab image.build's podman build stamps every layer file and the image's created time with
    SOURCE_DATE_EPOCH: a layer written at another time (the first build removed, so nothing is
    cached, and the file's mtime moved) has the same digest. The image ids still differ, by the
    build container's id and hostname that podman's docker format records (the provider behaviour):
    a rebuilt image is the same layers under another id, so a release names the digest it pushed."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text('FROM scratch\nCOPY served.txt /srv/served.txt\nCMD ["/probe"]\n')
    (context / "served.txt").write_text("the same bytes\n")
    repository = "localhost/frontier-reproducible-test"
    configs = []
    for build in (1, 2):
        os.utime(context / "served.txt", (1_000_000 * build, 1_000_000 * build))  # a fresh checkout's mtime
        image_id = build_image(
            repository, f"fab-{os.getpid()}-{build}", context=context, hostside_dir=context
        )
        configs.append(_saved_config(image_id, tmp_path))
        _podman("rmi", "--force", image_id)
    first, second = configs
    assert first["rootfs"] == second["rootfs"]
    assert first["created"] == second["created"] == "1980-01-01T00:00:00Z"
    assert first["container"] != second["container"]
    assert _without_build_fields(first) == _without_build_fields(second)
