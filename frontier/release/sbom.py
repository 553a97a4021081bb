"""Each runtime artifact's bill of materials (CycloneDX) and vulnerability audit (pip-audit).

``fab release.build`` makes both for the wheel it builds: the SBOM from the lock file the artifact
installs from (``requirements/runtime.txt`` for the wheel, ``requirements/image.txt`` for an image),
with the artifact itself as the described component and its sha256; the audit with pip-audit over
the same lock. The SBOM's digest goes into the artifact record, so into every release's
``release.json`` and under its signature; the SBOM and the audit are kept beside the artifact in the
history bucket (``artifacts/<digest>/sbom.cdx.json``, ``audit.json``) and a deploy's history record
carries their counts (``fab history``).

The tools run from their own venv (``.frontier/release-tools-venv``), installed from
``requirements/release-tools.txt`` with ``--require-hashes``.

An audit that could not ask about every package did not run: pip-audit reports a package its
service cannot find as skipped and still prints "No known vulnerabilities found"; here that is
``audit: not run (<reason>)``, never a zero. Where PyPI's per-release JSON is out of reach (as on
a machine that reaches PyPI's package index only), that is every package.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from frontier import project
from frontier.errors import FrontierError
from frontier.release.artifact import Artifact
from frontier.release.history import get_if_present

TOOLS_LOCK = project.root() / "requirements" / "release-tools.txt"
TOOLS_VENV = project.state_dir() / "release-tools-venv"
SBOM_NAME = "sbom.cdx.json"
AUDIT_NAME = "audit.json"
#: Severities from least to most severe; a finding whose severity the service does not give is
#: "unknown" and counts as at or above every threshold (refused rather than waved through).
SEVERITIES = ("low", "medium", "high", "critical")
Threshold = Literal["none", "low", "medium", "high", "critical"]


class SupplyChainError(FrontierError):
    """An SBOM or audit that cannot be made, or a release its audit refuses."""


def lock_for(artifact: Artifact) -> Path:
    """The lock file an artifact's Python packages come from."""
    name = "runtime.txt" if artifact.kind == "wheel" else "image.txt"
    return project.root() / "requirements" / name


# --- the tools -------------------------------------------------------------------------------------


def ensure_tools(venv: Path = TOOLS_VENV, lock: Path = TOOLS_LOCK) -> Path:
    """The tools' venv, (re)installed with --require-hashes when the lock changed; its bin folder."""
    stamp = venv / ".installed"
    want = hashlib.sha256(lock.read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text().strip() == want:
        return venv / "bin"
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--require-hashes", "--no-deps", "-r", str(lock)],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SupplyChainError(
                f"installing the release tools from {lock.name} failed: {(done.stderr or done.stdout).strip()[-2000:]}"
            )
    stamp.write_text(want + "\n")
    return venv / "bin"


# --- the SBOM --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sbom:
    document: bytes  # CycloneDX 1.6 JSON, reproducible (no timestamp, no random serial number)
    components: int

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.document).hexdigest()


def make_sbom(artifact: Artifact, lock: Path, bin_dir: Path) -> Sbom:
    """CycloneDX of ``artifact``: every locked package with its hashes, the artifact as the component
    described, with its own sha256."""
    pyproject = project.runtime_dir() / "pyproject.toml"
    with tempfile.TemporaryDirectory(prefix="frontier-sbom-") as tmp:
        out = Path(tmp) / SBOM_NAME
        command = [
            str(bin_dir / "cyclonedx-py"), "requirements", str(lock), "--of", "JSON", "--sv", "1.6",
            "--output-reproducible", "--pyproject", str(pyproject), "-o", str(out),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.is_file():
            raise SupplyChainError(f"cyclonedx-py failed: {(done.stderr or done.stdout).strip()[-2000:]}")
        data = json.loads(out.read_text())
    described = data.setdefault("metadata", {}).setdefault("component", {})
    described["hashes"] = [{"alg": "SHA-256", "content": artifact.digest.removeprefix("sha256:")}]
    if artifact.filename:
        described.setdefault("properties", []).append(
            {"name": "frontier:artifact", "value": artifact.filename}
        )
    if artifact.image:
        described.setdefault("properties", []).append({"name": "frontier:image", "value": artifact.image})
    document = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
    return Sbom(document=document, components=len(data.get("components", [])))


# --- the audit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    package: str
    version: str
    id: str
    fix_versions: tuple[str, ...] = ()
    severity: str = "unknown"


@dataclass(frozen=True)
class Audit:
    """pip-audit over a lock: ``ran`` only if every package was asked about."""

    ran: bool
    reason: str = ""  # why it did not run
    packages: int = 0
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        if not self.ran:
            return f"audit: not run ({self.reason})"
        if not self.findings:
            return f"audit: 0 known vulnerabilities in {self.packages} packages"
        by = {s: sum(f.severity == s for f in self.findings) for s in (*SEVERITIES, "unknown")}
        parts = ", ".join(f"{n} {s}" for s, n in by.items() if n)
        return f"audit: {len(self.findings)} known vulnerabilities in {self.packages} packages ({parts})"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Audit:
        data = json.loads(text)
        findings = tuple(
            Finding(**{**f, "fix_versions": tuple(f.get("fix_versions", ()))})
            for f in data.get("findings", [])
        )
        return cls(
            ran=data["ran"],
            reason=data.get("reason", ""),
            packages=data.get("packages", 0),
            findings=findings,
        )


def read_audit(report: dict[str, Any]) -> Audit:
    """pip-audit's JSON report as an :class:`Audit`; a skipped package means it did not run."""
    dependencies = report.get("dependencies", [])
    skipped = [d for d in dependencies if d.get("skip_reason")]
    if not dependencies:
        return Audit(ran=False, reason="pip-audit reported no packages")
    if skipped:
        first = str(skipped[0]["skip_reason"])
        return Audit(
            ran=False,
            reason=f"{len(skipped)} of {len(dependencies)} packages could not be audited, e.g. {first}",
            packages=len(dependencies),
        )
    findings = tuple(
        Finding(
            package=str(d["name"]),
            version=str(d.get("version", "")),
            id=str(v["id"]),
            fix_versions=tuple(str(x) for x in v.get("fix_versions", [])),
            severity=str(v.get("severity") or "unknown").lower(),
        )
        for d in dependencies
        for v in d.get("vulns", [])
    )
    return Audit(ran=True, packages=len(dependencies), findings=findings)


def run_audit(lock: Path, bin_dir: Path, timeout_s: float = 600) -> Audit:
    """pip-audit over ``lock`` against PyPI's vulnerability data; not run where it cannot ask."""
    with tempfile.TemporaryDirectory(prefix="frontier-audit-") as tmp:
        out = Path(tmp) / AUDIT_NAME
        command = [
            str(bin_dir / "pip-audit"), "-r", str(lock), "--disable-pip", "--require-hashes",
            "-f", "json", "--progress-spinner", "off", "-o", str(out),
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Audit(ran=False, reason=f"pip-audit did not finish in {timeout_s:.0f} s")
        # pip-audit exits 1 when it found vulnerabilities; the report says so either way.
        if not out.is_file():
            detail = (done.stderr or done.stdout).strip().splitlines()
            return Audit(
                ran=False, reason=f"pip-audit failed: {detail[-1] if detail else f'exit {done.returncode}'}"
            )
        return read_audit(json.loads(out.read_text()))


def refusal(audit: Audit, threshold: Threshold, stack: str) -> str | None:
    """Why ``stack`` refuses a release with this audit (``releases.refuse_vulnerabilities_at``), or None."""
    if threshold == "none":
        return None
    if not audit.ran:
        return (
            f"stack {stack} refuses releases with known vulnerabilities at or above {threshold}, and this "
            f"release's {audit.summary()}"
        )
    floor = SEVERITIES.index(threshold)
    hits = [
        f for f in audit.findings if f.severity not in SEVERITIES or SEVERITIES.index(f.severity) >= floor
    ]
    if not hits:
        return None
    named = ", ".join(f"{f.package} {f.version} {f.id} ({f.severity})" for f in hits[:5])
    return (
        f"stack {stack} refuses releases with known vulnerabilities at or above {threshold}: "
        f"{len(hits)} found ({named}{', ...' if len(hits) > 5 else ''})"
    )


# --- kept beside the artifact ----------------------------------------------------------------------


@dataclass(frozen=True)
class SupplyChain:
    """What the history keeps of an artifact's SBOM and audit."""

    sbom_digest: str
    components: int
    audit: Audit

    def line(self) -> str:
        return f"sbom: {self.components} components ({self.sbom_digest[:19]}); {self.audit.summary()}"


def _base(store: Any, digest: str) -> str:
    return f"{store.artifacts_prefix}artifacts/{digest.replace(':', '-')}/"


def put_supply_chain(store: Any, artifact: Artifact, sbom: Sbom, audit: Audit) -> SupplyChain:
    base = _base(store, artifact.digest)
    store.s3.put_object(Bucket=store.bucket, Key=base + SBOM_NAME, Body=sbom.document)
    store.s3.put_object(Bucket=store.bucket, Key=base + AUDIT_NAME, Body=audit.to_json().encode())
    return SupplyChain(sbom_digest=sbom.digest, components=sbom.components, audit=audit)


def get_supply_chain(store: Any, artifact: Artifact) -> SupplyChain | None:
    """The SBOM's counts and the audit kept for ``artifact``; None where it has no SBOM."""
    if not artifact.sbom:
        return None
    base = _base(store, artifact.digest)
    sbom = get_if_present(store.s3, store.bucket, base + SBOM_NAME)
    audit = get_if_present(store.s3, store.bucket, base + AUDIT_NAME)
    if sbom is None or audit is None:
        raise SupplyChainError(f"artifact {artifact.digest}: its SBOM or audit is missing from the history")
    document = sbom["Body"].read()
    digest = "sha256:" + hashlib.sha256(document).hexdigest()
    if digest != artifact.sbom:
        raise SupplyChainError(
            f"artifact {artifact.digest}: the stored SBOM is {digest}, its record says {artifact.sbom}"
        )
    components = len(json.loads(document).get("components", []))
    return SupplyChain(
        sbom_digest=digest, components=components, audit=Audit.from_json(audit["Body"].read().decode())
    )


def survey(artifact: Artifact, threshold: Threshold, stack: str) -> tuple[Artifact, Sbom, Audit]:
    """The SBOM and audit of a freshly built ``artifact``, and the artifact naming its SBOM; raises
    :class:`SupplyChainError` when the stack's threshold refuses it (before anything is registered)."""
    bin_dir = ensure_tools()
    lock = lock_for(artifact)
    sbom = make_sbom(artifact, lock, bin_dir)
    audit = run_audit(lock, bin_dir)
    refused = refusal(audit, threshold, stack)
    if refused is not None:
        raise SupplyChainError(f"release refused: {refused}")
    return replace(artifact, sbom=sbom.digest), sbom, audit
