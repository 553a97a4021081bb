"""What runs on one host, over a Fabric connection.

Files travel by SFTP; every step on the host is one call of the host agent
(:mod:`frontier_hostside.agent`, uploaded as it is beside the names it imports, with its
configuration rendered for this host by :func:`frontier.render.host.render_agent_config`), so a
phase costs one SSH command. The agent
answers in JSON, read here into typed results; a failed step raises :class:`HostError` with the
phase and the agent's own message. The layout follows releases/current::

    <root>/releases/<id>/      runtime.yaml, the systemd unit, release.json, site/ (the wheel, installed)
    <root>/releases.json       the release order, most recent first (prune keeps the newest)
    <root>/current -> releases/<id>      swapped atomically (temp symlink + rename)
    <root>/previous -> releases/<id>     what current pointed at before the last swap
    <root>/bin/                the agent, its names and its configuration (frontier-agent.py,
                               frontier_hostside/, frontier-agent.json)
    <root>/artifacts/          wheels copied to this host, by digest
    <root>/env                 the runtime's environment (AWS endpoint and credentials), written by whoever prepares the host
    <root>/run/, <root>/logs/  pid file and the runtime's log (process launcher only)
"""

from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import frontier_hostside
from fabric import Connection
from frontier_hostside.agent import Facts
from frontier_hostside.names import AGENT_CONFIG_NAME, AGENT_FILE_NAME
from frontier_hostside.release_signature import SIGNATURE_NAME

from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.release.release import MANIFEST, Release
from frontier.render.host import render_agent_config

# What a host runs and holds, as the agent reports it (``runs(release_id)`` included).
HostFacts = Facts


@dataclass
class Pruned:
    """What a host's prune removed: release ids, and cached weights versions (``bucket/prefix/version``)."""

    releases: list[str]
    weights: list[str]

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> Pruned:
        """The agent's ``prune`` answer (``weights_evicted`` only when it evicted anything)."""
        return cls(
            releases=[str(r) for r in answer["pruned"]],
            weights=[str(w) for w in answer.get("weights_evicted", [])],
        )

    def __str__(self) -> str:
        parts = [" ".join(self.releases)] if self.releases else []
        if self.weights:
            parts.append("weights evicted: " + " ".join(self.weights))
        return "; ".join(parts) or "nothing to prune"


class HostError(FrontierError):
    """A step on a host failed; the message carries the host's own words."""

    def __init__(self, host: str, step: str, detail: str) -> None:
        super().__init__(f"{host}: {step} failed: {detail}")
        self.host = host
        self.step = step
        self.detail = detail


def render_host_agent_config(settings: Settings, pool: PoolSettings, host: HostSpec) -> str:
    """The agent configuration of ``host``, a host of ``pool`` (``frontier-agent.json``)."""
    return render_agent_config(
        settings, pool, host=host.name, root=host.root, python=host.python, address=host.address
    )


def _answer(stdout: str) -> dict[str, Any] | None:
    """The agent's JSON answer: the last line of its output that is a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                break
            if isinstance(data, dict):
                return data
    return None


class HostSession:
    """One host of ``pool`` during one command: a connection and the host agent."""

    def __init__(self, settings: Settings, pool: PoolSettings, host: HostSpec, conn: Connection) -> None:
        self.settings = settings
        self.pool = pool
        self.host = host
        self.conn = conn
        self.root = host.root.rstrip("/")
        self.sudo = "" if settings.inventory.ssh_user == "root" else "sudo -n "
        # Non-root users upload to /tmp and the agent (under sudo) moves things into place.
        self.upload_root = self.root if not self.sudo else f"/tmp/frontier-upload-{settings.stack}"
        self.agent_path = f"{self.upload_root}/bin/{AGENT_FILE_NAME}"
        self.config_path = f"{self.upload_root}/bin/{AGENT_CONFIG_NAME}"
        self._agent_ready = False
        self._sftp: Any = None

    # --- plumbing ---------------------------------------------------------------------------------

    @property
    def sftp(self) -> Any:
        if self._sftp is None:
            try:
                self._sftp = self.conn.sftp()
            except Exception as exc:  # paramiko/socket errors all mean: the host is unreachable
                raise HostError(self.host.name, "connect", f"{type(exc).__name__}: {exc}") from exc
        return self._sftp

    def close(self) -> None:
        self._sftp = None
        self.conn.close()

    def _mkdirs(self, path: str) -> None:
        parts = path.strip("/").split("/")
        current = ""
        for part in parts:
            current += "/" + part
            try:
                self.sftp.stat(current)
            except FileNotFoundError:
                self.sftp.mkdir(current)

    def _put_bytes(self, data: bytes, remote: str, mode: int = 0o644) -> None:
        tmp = f"{remote}.{uuid.uuid4().hex[:8]}.tmp"
        with self.sftp.open(tmp, "wb") as fh:
            fh.write(data)
        self.sftp.chmod(tmp, mode)
        self.sftp.posix_rename(tmp, remote)

    def _remote_sha(self, remote: str) -> str | None:
        try:
            with self.sftp.open(remote, "rb") as fh:
                return hashlib.sha256(fh.read()).hexdigest()
        except FileNotFoundError:
            return None

    def _put_if_changed(self, data: bytes, remote: str, mode: int) -> None:
        if self._remote_sha(remote) != hashlib.sha256(data).hexdigest():
            self._put_bytes(data, remote, mode)

    def ensure_agent(self) -> None:
        """Upload the agent, its names and its configuration where they differ from what the host has."""
        if self._agent_ready:
            return
        # The agent ships as its own source file: what is tested here is byte for byte what hosts run.
        for name, data in frontier_hostside.agent_files().items():
            remote = f"{self.upload_root}/bin/{name}"
            self._mkdirs(remote.rsplit("/", 1)[0])
            self._put_if_changed(data, remote, 0o755 if name == AGENT_FILE_NAME else 0o644)
        self._put_if_changed(
            render_host_agent_config(self.settings, self.pool, self.host).encode(), self.config_path, 0o644
        )
        self._agent_ready = True

    def agent(self, step: str, *args: str, timeout: float | None = None) -> dict[str, Any]:
        """Run one agent command for the rollout phase ``step``; its JSON answer, or HostError."""
        self.ensure_agent()
        words = [self.host.python, self.agent_path, "--config", self.config_path, *args]
        command = self.sudo + " ".join(shlex.quote(w) for w in words)
        try:
            result = self.conn.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
        except Exception as exc:
            raise HostError(self.host.name, step, f"{type(exc).__name__}: {exc}") from exc
        answer = _answer(result.stdout)
        if result.exited != 0 or answer is None or not answer.get("ok"):
            if answer is not None and answer.get("error"):
                detail = str(answer["error"])
                if answer.get("log_tail"):
                    detail += "\n" + str(answer["log_tail"]).rstrip()
            else:
                detail = (result.stdout + result.stderr).strip() or f"exit {result.exited}"
            raise HostError(self.host.name, step, detail)
        return answer

    # --- phases -----------------------------------------------------------------------------------

    def facts(self, release_id: str = "") -> HostFacts:
        return HostFacts.from_dict(
            self.agent("facts", "facts", *(["--release", release_id] if release_id else []))
        )

    def status(self) -> HostFacts:
        return HostFacts.from_dict(self.agent("status", "status"))

    def stage(self, release: Release, wheel: Path | None) -> bool:
        """Put the release into ``releases/<id>/``; False when it was already there, intact."""
        manifest = release.manifest().encode()
        facts = self.facts(release.id)
        if facts.staged_manifest == hashlib.sha256(manifest).hexdigest():
            return False
        incoming = f"{self.upload_root}/releases/.incoming-{release.id}-{uuid.uuid4().hex[:6]}"
        self._mkdirs(incoming)
        for name, text in release.files.items():
            self._put_bytes(text.encode(), f"{incoming}/{name}")
        if release.signature:
            self._put_bytes(release.signature.encode(), f"{incoming}/{SIGNATURE_NAME}")
        self._put_bytes(manifest, f"{incoming}/{MANIFEST}")
        args = ["stage", release.id, incoming]
        if release.artifact.kind == "wheel":
            if wheel is None:
                raise HostError(
                    self.host.name, "stage", f"release {release.id} needs its wheel and none was given"
                )
            remote_dir = f"{self.upload_root}/artifacts/{release.digest.replace(':', '-')}"
            remote_wheel = f"{remote_dir}/{release.artifact.filename}"
            if self._remote_sha(remote_wheel) != release.digest.split(":", 1)[1]:
                self._mkdirs(remote_dir)
                self._put_bytes(wheel.read_bytes(), remote_wheel)
            args += ["--wheel", remote_wheel]
        self.agent("stage", *args)
        return True

    def stop(self) -> str:
        """Stop the runtime; how it went (``terminated``, ``killed``, ``absent``, ``stopped`` by systemd)."""
        return str(self.agent("stop", "stop")["outcome"])

    def activate(self, release_id: str) -> None:
        self.agent("activate", "activate", release_id)

    def activate_and_start(self, release_id: str) -> None:
        """Point ``current`` at the release and start it: one command on the host."""
        self.agent("start", "start", "--activate", release_id)

    def start(self) -> None:
        self.agent("start", "start")

    def wait_ready(self, timeout: float) -> float:
        """Seconds until the runtime answered ready; HostError when it exits or is not ready in time."""
        answer = self.agent("readiness", "wait-ready", f"{timeout:g}", timeout=timeout + 30)
        return float(answer["after_s"])

    def metrics(self) -> str:
        return str(self.agent("metrics", "metrics", timeout=30)["metrics"])

    def prune(self, keep: int) -> Pruned:
        """Remove all but ``keep`` releases; the host also evicts cached weights no release left needs."""
        return Pruned.from_answer(self.agent("prune", "prune", str(keep)))
