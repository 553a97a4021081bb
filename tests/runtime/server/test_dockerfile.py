"""The runtime image's Dockerfile (no container engine runs here, so its contents are checked):
CUDA base, the wheel built from these sources is the one installed, non-root, liveness health
check, SIGTERM, and the serve command the host's unit runs."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import httpx
import pytest
from frontier_runtime.__main__ import _parser, main
from frontier_runtime.server.probe import PROBE_FILE_ENV

REPO = Path(__file__).resolve().parents[3]
RUNTIME = REPO / "runtime"


def _instructions() -> list[tuple[str, str]]:
    text = (RUNTIME / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), " ".join(rest.split())))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _args() -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in _instructions() if keyword == "ARG" and "=" in rest)


def _project() -> dict:
    return tomllib.loads((RUNTIME / "pyproject.toml").read_text())["project"]


def _hostside_project() -> dict:
    return tomllib.loads((REPO / "hostside" / "pyproject.toml").read_text())["project"]


def _expected_wheel() -> str:
    project = _project()
    return f"{re.sub(r'[-_.]+', '_', project['name'])}-{project['version']}-py3-none-any.whl"


def test_the_base_image_is_cuda() -> None:
    assert _args()["CUDA_IMAGE"].startswith("nvidia/cuda:")
    assert all(rest.startswith("${CUDA_IMAGE}") for keyword, rest in _instructions() if keyword == "FROM")


def test_the_wheel_is_built_from_these_sources_in_the_first_stage() -> None:
    build = _stages()[0]
    assert build[0] == ("FROM", "${CUDA_IMAGE} AS wheel")
    copies = [rest for keyword, rest in build if keyword == "COPY"]
    assert "pyproject.toml ./" in copies and "frontier_runtime ./frontier_runtime" in copies
    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    assert "pip wheel --no-deps" in runs and "--wheel-dir /dist ." in runs
    assert f"ls /dist/{_expected_wheel()}" in runs, "the build must fail if the wheel's name ever changes"


def test_the_final_stage_installs_exactly_the_built_wheel() -> None:
    final = _stages()[-1]
    wheel = _expected_wheel()
    assert ("COPY", f"--from=wheel /dist/{wheel} /tmp/") in final
    runs = [rest for keyword, rest in final if keyword == "RUN"]
    assert any(rest.startswith(f"pip install --no-deps /tmp/{wheel}") for rest in runs)


def test_the_hostside_wheel_is_built_from_its_build_context_and_installed_with_the_runtime() -> None:
    build, final = _stages()[0], _stages()[-1]
    hostside = f"frontier_hostside-{_hostside_project()['version']}-py3-none-any.whl"
    copies = [rest for keyword, rest in build if keyword == "COPY"]
    assert "--from=hostside frontier_hostside /hostside/frontier_hostside" in copies
    assert "--from=hostside pyproject.toml /hostside/" in copies
    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    assert (
        "--wheel-dir /dist . /hostside" in runs and f"ls /dist/{_expected_wheel()} /dist/{hostside}" in runs
    )
    assert ("COPY", f"--from=wheel /dist/{hostside} /tmp/") in final
    # One pip install: the runtime's dependency on frontier-hostside is met by this wheel, not an index.
    installs = [
        rest for keyword, rest in final if keyword == "RUN" and rest.startswith("pip install --no-deps /tmp/")
    ]
    assert installs and f"/tmp/{hostside}" in installs[0].split(" && ")[0]


LOCK_INSTALL = "--require-hashes --no-deps -r /tmp/requirements.txt"


def test_both_stages_install_every_third_party_wheel_from_the_lock_with_its_hashes() -> None:
    assert _args()["IMAGE_LOCK"] == "image.txt" and (REPO / "requirements" / "image.txt").is_file()
    for stage in _stages():
        assert ("COPY", "--from=requirements ${IMAGE_LOCK} /tmp/requirements.txt") in stage
        runs = [rest for keyword, rest in stage if keyword == "RUN"]
        assert any(LOCK_INSTALL in rest for rest in runs)
        # Nothing else is resolved: every other pip install names our own wheels with --no-deps.
        for rest in runs:
            for install in re.findall(r"pip install [^&]*", rest):
                assert LOCK_INSTALL in install or install.startswith("pip install --no-deps /tmp/"), install


def test_torch_is_the_version_the_runtime_pins_in_both_image_locks() -> None:
    pinned = next(dep for dep in _project()["dependencies"] if dep.startswith("torch=="))
    for lock, local in (("image.txt", ""), ("image-cpu.txt", "+cpu")):
        text = (REPO / "requirements" / lock).read_text()
        assert re.search(rf"^{re.escape(pinned)}{re.escape(local)} \\$", text, re.M), lock


def test_the_cuda_image_reads_its_gpus_through_nvml() -> None:
    # torch.cuda.utilization imports pynvml (nvidia-ml-py): without it the runtime's GPU gauges and
    # the load report's GPU use read nothing on a GPU host. The CPU variant has no GPU to ask.
    assert re.search(r"^nvidia-ml-py==[0-9.]+ \\$", (REPO / "requirements" / "image.txt").read_text(), re.M)
    assert "nvidia-ml-py" not in (REPO / "requirements" / "image-cpu.txt").read_text()


def test_the_final_stage_checks_the_installed_set_is_whole() -> None:
    runs = " ".join(rest for keyword, rest in _stages()[-1] if keyword == "RUN")
    assert "pip check" in runs


def test_pips_bytecode_is_hash_based_in_both_stages() -> None:
    # py_compile writes checked-hash .pyc under SOURCE_DATE_EPOCH (no source mtime inside).
    assert _args()["SOURCE_DATE_EPOCH"].isdigit()
    for stage in _stages():
        assert ("ARG", "SOURCE_DATE_EPOCH") in stage


def test_the_runtime_runs_as_an_unprivileged_user() -> None:
    users = [rest for keyword, rest in _stages()[-1] if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}


def test_sigterm_stops_it_and_the_health_check_is_the_liveness_probe() -> None:
    instructions = dict(_instructions())
    assert instructions["STOPSIGNAL"] == "SIGTERM"
    check = instructions["HEALTHCHECK"]
    assert check.endswith('CMD ["python", "-m", "frontier_runtime", "probe"]')
    assert "--start-period=" in check  # weights download and warm-up must not count as failures
    assert f"{PROBE_FILE_ENV}=/tmp/" in " ".join(
        rest for keyword, rest in _instructions() if keyword == "ENV"
    )


def test_the_command_is_the_serve_command_the_host_unit_runs() -> None:
    instructions = _instructions()
    assert not [rest for keyword, rest in instructions if keyword == "ENTRYPOINT"], (
        "the unit passes a full command"
    )
    command = json.loads(next(rest for keyword, rest in instructions if keyword == "CMD"))
    assert command[:5] == ["python", "-m", "frontier_runtime", "serve", "--config"]
    args = _parser().parse_args(command[3:])
    assert args.command == "serve" and str(args.config).endswith("runtime.yaml")
    unit = (REPO / "templates" / "frontier-runtime.service.j2").read_text()
    assert "python -m frontier_runtime serve --config" in unit


def test_the_build_context_leaves_out_build_leftovers() -> None:
    ignored = (RUNTIME / ".dockerignore").read_text().split()
    assert "*.egg-info" in ignored and "**/__pycache__" in ignored


def test_the_probe_follows_the_running_server(
    serve, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setenv(PROBE_FILE_ENV, str(tmp_path / "probe.json"))
    srv = serve(health__liveness_path="/alive")
    assert json.loads((tmp_path / "probe.json").read_text())["url"] == srv.url
    assert main(["probe"]) == 0
    srv.state.health.draining = True
    assert main(["probe"]) == 0, "draining is not dead: liveness holds"
    assert main(["probe", "--ready"]) == 1
    assert httpx.get(f"{srv.url}/alive").status_code == 200
    srv.stop()
    assert main(["probe"]) == 1


def test_the_runtime_stages_apt_steps_leave_nothing_that_holds_the_time_they_ran() -> None:
    # Two builds of one commit differed in these alone (scripts/reproducible_image.py --image).
    stamped = ("/var/cache/apt/*.bin", "/var/cache/ldconfig/aux-cache", "/var/log/apt", "/var/log/dpkg.log")
    for rest in (rest for keyword, rest in _stages()[-1] if keyword == "RUN" and "apt-get install" in rest):
        assert all(path in rest for path in stamped), rest
