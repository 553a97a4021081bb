"""`make scan` fails on a weakened workload: checkov (its own venv, `make scan` installs it) over eks-prod's
workload objects as rendered (its NetworkPolicies among them: checkov's graph checks want them), then over
the same objects with the runtime Deployment stripped of its security contexts.

Marked e2e: each case starts the scan script and checkov (processes, ~10 s each).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from frontier.targets import backend_for

REPO = Path(__file__).resolve().parents[2]
SCAN = REPO / "scripts" / "security_scan.py"
CHECKOV = REPO / ".frontier" / "checkov-venv" / "bin" / "checkov"

pytestmark = [
    pytest.mark.e2e,
    # Skipped where checkov's venv was never made (a bare pytest run); in CI (`make test` makes it
    # first) a missing venv runs the tests, which then fail naming the missing checkov.
    pytest.mark.skipif(
        not CHECKOV.exists() and not os.environ.get("CI"),
        reason="checkov's venv is absent: `make scan` installs it",
    ),
]


def scan(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCAN), "--checkov", str(CHECKOV), "--only", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def workload(eks_prod) -> dict[str, dict]:
    """The runtime's objects (the monitoring and logging ones apart: they carry the DCGM exporter's and
    the log shipper's exceptions)."""
    files = backend_for(eks_prod).rendered_files("sha256:" + "ab" * 32)
    return {
        Path(rel).name: yaml.safe_load(t)
        for rel, t in files.items()
        if "/monitoring/" not in rel and "/logging/" not in rel
    }


@pytest.fixture
def deployment(workload) -> dict:
    [name] = [n for n in workload if "-deployment-" in n]
    return copy.deepcopy(workload[name])


def write(folder: Path, workload: dict[str, dict], deployment: dict) -> Path:
    folder.mkdir()
    for name, manifest in workload.items():
        manifest = deployment if "-deployment-" in name else manifest
        (folder / name).write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


def test_the_rendered_runtime_objects_pass_every_check(tmp_path, workload, deployment):
    """Control: what the weakened copy below differs from passes with no exception at all."""
    done = scan(write(tmp_path / "rendered", workload, deployment))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inline exceptions (0)" in done.stdout
    [row] = [line.split() for line in done.stdout.splitlines() if line.startswith("kubernetes/rendered")]
    assert row[3] == "0" and int(row[2]) > 20  # failed, passed


def test_a_pod_without_a_security_context_fails_the_scan(tmp_path, workload, deployment):
    weak = deployment
    pod = weak["spec"]["template"]["spec"]
    del pod["securityContext"]
    for container in pod["containers"] + pod.get("initContainers", []):
        container.pop("securityContext", None)
    done = scan(write(tmp_path / "weakened", workload, weak))
    assert done.returncode == 1, done.stdout + done.stderr
    failed = done.stdout.split("FAILED:", 1)[1]
    # The pod's and the containers' contexts: seccomp, privilege escalation, root, read-only root.
    for check in ("CKV_K8S_29", "CKV_K8S_20", "CKV_K8S_23", "CKV_K8S_22", "CKV_K8S_31"):
        assert check in failed, done.stdout


def test_an_exception_without_a_reason_fails_the_scan(tmp_path, workload, deployment):
    weak = deployment
    del weak["spec"]["template"]["spec"]["securityContext"]
    weak["metadata"].setdefault("annotations", {})["checkov.io/skip1"] = "CKV_K8S_29"
    done = scan(write(tmp_path / "unexplained", workload, weak))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "exceptions without a reason: CKV_K8S_29" in done.stdout


def test_the_log_shippers_objects_pass_with_its_two_root_exceptions_only(tmp_path, eks_prod):
    files = backend_for(eks_prod).rendered_files("sha256:" + "ab" * 32)
    folder = tmp_path / "logging"
    folder.mkdir()
    for rel, text in files.items():
        if "/logging/" in rel:
            (folder / Path(rel).name).write_text(text)
    done = scan(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inline exceptions (2)" in done.stdout
    assert "CKV_K8S_23" in done.stdout and "CKV_K8S_40" in done.stdout
