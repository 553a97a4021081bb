"""What runs on one host, over a Fabric connection.

Files travel by SFTP; every step on the host is one call of ``frontier-hostctl`` (rendered from
``templates/frontier-hostctl.sh.j2`` for this host), so a phase costs one SSH command. The layout
follows releases/current::

    <root>/releases/<id>/      runtime.yaml, the systemd unit, release.json, site/ (the wheel, installed)
    <root>/current -> releases/<id>      swapped atomically (temp symlink + mv -T)
    <root>/previous -> releases/<id>     what current pointed at before the last swap
    <root>/artifacts/          wheels copied to this host, by digest
    <root>/env                 the runtime's environment (AWS endpoint and credentials), written by whoever prepares the host
    <root>/run/, <root>/logs/  pid file and the runtime's log (process launcher only)
"""

from __future__ import annotations

import hashlib
import shlex
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import Connection

from frontier.config.stack import Settings
from frontier.errors import FrontierError
from frontier.fleet.inventory import HostSpec
from frontier.release.release import MANIFEST, Release
from frontier.render.files import ENV

CTL_TEMPLATE = "frontier-hostctl.sh.j2"


class HostError(FrontierError):
    """A step on a host failed; the message carries the host's own words."""

    def __init__(self, host: str, step: str, detail: str) -> None:
        super().__init__(f"{host}: {step} failed: {detail}")
        self.host = host
        self.step = step
        self.detail = detail


@dataclass
class HostFacts:
    current: str = ""
    previous: str = ""
    systemd: bool = False
    running: bool = False
    running_release: str = ""
    releases: list[str] = field(default_factory=list)
    staged_manifest: str = ""
    ready: bool = False
    live: bool = False
    digest: str = ""

    @classmethod
    def parse(cls, output: str) -> HostFacts:
        """Facts from the ``key=value`` lines that ``frontier-hostctl facts|status`` prints."""
        data = _parse(output)
        return cls(
            current=data.get("current", ""),
            previous=data.get("previous", ""),
            systemd=data.get("systemd") == "1",
            running=data.get("running") == "1",
            running_release=data.get("running_release", ""),
            releases=data.get("releases", "").split(),
            staged_manifest=data.get("staged_manifest", ""),
            ready=data.get("ready") == "1",
            live=data.get("live") == "1",
            digest=data.get("digest", ""),
        )

    def runs(self, release_id: str) -> bool:
        """The host's live runtime process serves ``release_id`` (a stale record of a dead one does not count)."""
        return self.running and self.current == release_id and self.running_release == release_id


def render_ctl(settings: Settings, host: HostSpec) -> str:
    return ENV.get_template(CTL_TEMPLATE).render(
        stack=settings.stack,
        host=host.name,
        root=host.root,
        python=host.python,
        address=host.address,
        port=settings.runtime.port,
        readiness_path=settings.health.readiness_path,
        liveness_path=settings.health.liveness_path,
        drain_timeout_s=int(settings.runtime.drain_timeout_s + 0.999),
    )


def _parse(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            out[key] = value.strip()
    return out


class HostSession:
    """One host during one command: a connection and the host control script."""

    def __init__(self, settings: Settings, host: HostSpec, conn: Connection) -> None:
        self.settings = settings
        self.host = host
        self.conn = conn
        self.root = host.root.rstrip("/")
        self.sudo = "" if settings.inventory.ssh_user == "root" else "sudo -n "
        # Non-root users upload to /tmp and the control script (under sudo) moves things into place.
        self.upload_root = self.root if not self.sudo else f"/tmp/frontier-upload-{settings.stack}"
        self.ctl_path = f"{self.upload_root}/bin/frontier-hostctl"
        self._ctl_ready = False
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

    def ensure_ctl(self) -> None:
        if self._ctl_ready:
            return
        text = render_ctl(self.settings, self.host).encode()
        self._mkdirs(f"{self.upload_root}/bin")
        if self._remote_sha(self.ctl_path) != hashlib.sha256(text).hexdigest():
            self._put_bytes(text, self.ctl_path, 0o755)
        self._ctl_ready = True

    def ctl(self, step: str, *args: str, timeout: float | None = None) -> str:
        self.ensure_ctl()
        command = f"{self.sudo}bash {shlex.quote(self.ctl_path)} " + " ".join(shlex.quote(a) for a in args)
        try:
            result = self.conn.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
        except Exception as exc:
            raise HostError(self.host.name, step, f"{type(exc).__name__}: {exc}") from exc
        if result.exited != 0:
            detail = (result.stdout + result.stderr).strip()
            raise HostError(self.host.name, step, detail or f"exit {result.exited}")
        return result.stdout

    # --- phases -----------------------------------------------------------------------------------

    def facts(self, release_id: str = "") -> HostFacts:
        return HostFacts.parse(self.ctl("facts", "facts", *([release_id] if release_id else [])))

    def status(self) -> HostFacts:
        return HostFacts.parse(self.ctl("status", "status"))

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
            args.append(remote_wheel)
        self.ctl("stage", *args)
        return True

    def stop(self) -> None:
        self.ctl("stop", "stop")

    def activate_and_start(self, release_id: str) -> None:
        self.ctl("activate", "activate", release_id)
        self.ctl("start", "start")

    def wait_ready(self, timeout: float) -> None:
        self.ctl("readiness", "wait-ready", str(int(timeout + 0.999)), timeout=timeout + 30)

    def metrics(self) -> str:
        return self.ctl("metrics", "metrics", timeout=30)

    def prune(self, keep: int) -> list[str]:
        return _parse(self.ctl("prune", "prune", str(keep))).get("pruned", "").split()
