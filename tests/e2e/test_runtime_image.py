"""The runtime image: runtime/Dockerfile built with podman and run the way a GPU host's unit runs it.

The CPU variant is the production Dockerfile on another base: a root file system from Debian's
packages (scripts/build-debian-base.sh; no registry can be pulled from here), every wheel from a
local wheelhouse that the host's pip fills (torch's CPU wheel lies on local disk), and the build
runs with no network at all. The container runs with the flags of templates/frontier-runtime.service.j2:
uid 10001, a read-only root, /tmp on a tmpfs, the release read-only, the weights cache bind-mounted
writable; the runtime fetches the weights from S3 (moto's server on loopback, over the host network)
into that cache, verifies them and serves.

The first run on a machine pays for the base and the image (see docs/runtime.md, "The image"); both
stay in podman's store under tags derived from their content, so later runs only start containers.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_hostside.names import CLOUD_WEIGHTS_CACHE, CONTAINER_RELEASE_DIR, READINESS_PATH, RUNTIME_UID
from frontier_runtime.config import parse_config
from moto.server import ThreadedMotoServer

from frontier import project
from frontier.release import weights
from frontier.release.artifact import PODMAN_BUILD_FORMAT, build_image
from frontier.render.boot import render_mount_cache
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
IMAGE_REPOSITORY = "localhost/frontier-runtime"
# podman's global flags in this sandbox: crun cannot run with cgroups in hybrid mode, runc can.
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager=cgroupfs")
# `podman run` flags this sandbox needs and a GPU host does not: raising rlimits above the current
# ones is refused, and no CNI plugins are installed (the unit runs with --network host anyway).
SANDBOX_RUN_FLAGS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "host")
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


def _requirements() -> list[str]:
    """Every wheel the Dockerfile installs: the runtime's and the host side's dependencies (ours are
    built in the image), and the build system the wheel stage installs."""
    runtime = tomllib.loads((CONTEXT / "pyproject.toml").read_text())
    hostside = tomllib.loads((HOSTSIDE / "pyproject.toml").read_text())
    wanted = [
        *runtime["project"]["dependencies"],
        *hostside["project"]["dependencies"],
        *runtime["build-system"]["requires"],
    ]
    return sorted({req for req in wanted if not req.startswith("frontier-")})


def _wheelhouse() -> Path:
    """The wheels, downloaded once per requirement set by the host's pip (its configuration knows
    where torch's CPU wheel is); the image build mounts this folder and reaches nothing else."""
    requirements = _requirements()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    house = project.state_dir() / "wheelhouse" / key
    if (house / ".complete").exists():
        return house
    partial = house.with_name(f".{key}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(partial),
        *requirements,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.fail(f"pip download of the image's wheels failed:\n{result.stderr[-3000:]}")
    (partial / ".complete").write_text("\n".join(requirements) + "\n")
    shutil.rmtree(house, ignore_errors=True)
    partial.rename(house)
    return house


def _debian_base() -> str:
    """The local base image, built from Debian's packages the first time on this machine."""
    result = subprocess.run(["bash", str(BASE_SCRIPT)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"{BASE_SCRIPT.name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


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
    leaves it, and the parts of the hostside context the Dockerfile copies (build leftovers out)."""
    ignore = CONTEXT / ".dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip()[:1] not in ("", "#")]
    files = [("Dockerfile", CONTEXT / "Dockerfile")]
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
    base_id = _podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    build_args = {"CUDA_IMAGE": base, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheelhouse"}
    content = json.dumps([_context_digest(), base_id, wheelhouse.name, build_args], sort_keys=True)
    ref = f"{IMAGE_REPOSITORY}:cpu-{hashlib.sha256(content.encode()).hexdigest()[:12]}"
    if _podman("image", "exists", ref, check=False).returncode == 0:
        return Image(ref)
    _podman(
        "build", *PODMAN_BUILD_FORMAT,  # docker's format keeps the HEALTHCHECK (OCI has none)
        "--network", "none",  # everything comes from the base and the wheelhouse
        "--build-context", f"hostside={HOSTSIDE}",
        *(arg for name, value in build_args.items() for arg in ("--build-arg", f"{name}={value}")),
        "--volume", f"{wheelhouse}:/wheelhouse:ro",
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


def _start(image: Image, weights_: Weights, root: Path, cache: Path, name: str) -> Container:
    port = _free_port()
    release = _release(root, weights_, port)
    _podman(
        "run", "--detach", "--name", name, *SANDBOX_RUN_FLAGS,
        "--user", f"{RUNTIME_UID}:{RUNTIME_UID}",
        "--read-only",
        "--tmpfs", "/tmp:rw,nosuid,nodev,size=64m",
        "--mount", f"type=bind,source={release},target={CONTAINER_RELEASE_DIR},readonly",
        "--mount", f"type=bind,source={cache},target={CLOUD_WEIGHTS_CACHE}",
        "--env", f"AWS_ENDPOINT_URL={weights_.endpoint}",
        "--env", "AWS_REGION=us-east-1", "--env", "AWS_DEFAULT_REGION=us-east-1",
        # moto's server takes any key; a host's instance profile gives real ones.
        "--env", "AWS_ACCESS_KEY_ID=testing", "--env", "AWS_SECRET_ACCESS_KEY=testing",
        image.ref,
        "python", "-m", "frontier_runtime", "serve", "--config", f"{CONTAINER_RELEASE_DIR}/runtime.yaml",
    )  # fmt: skip
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
