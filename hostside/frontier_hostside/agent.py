"""The host agent: the runtime's life cycle on one host, one subcommand per rollout phase.

This file is uploaded as it is to every host as ``frontier-agent.py``, next to
``frontier-agent.json`` (its configuration, rendered by
:func:`frontier.render.host.render_agent_config`) and ``frontier_hostside/`` (the names and the
modules it imports; :func:`frontier_hostside.agent_files` is what travels), and run there by the
host's own ``python3``. So it imports the standard library only and runs on Python 3.8 and later.
Every command prints exactly one JSON object on stdout; a failed command prints ``{"ok": false,
"error": ..., "phase": ...}`` and exits non-zero (2: refused or failed, 3: the runtime exited
during start-up, 4: not ready in time)::

    facts [--release ID]     current/previous release, what runs, releases newest first, a staged manifest's hash
    stage ID DIR [--wheel W] verify DIR against its release.json, install the wheel, move it to releases/ID
    activate ID              point ``current`` at releases/ID atomically; ``previous`` at what it was
    start [--activate ID]    (activate, then) start the current release: systemd where it runs, else a process
    stop                     stop the runtime (the process launcher: SIGTERM, drain, SIGKILL)
    wait-ready SECONDS       poll the readiness path; fail early when the runtime exits
    metrics | status         the runtime's /metrics; facts plus readiness, liveness, digest and restarts
    prune KEEP               keep the KEEP most recent releases (never current or previous)
    prefetch [--release ID]  warm the weights cache with what the release's start reads (default: current); start nothing
    supervise                (run by ``start``) keep the current release's runtime up (see below)
    interruptions [--imds URL] [--interval S]  poll IMDS for spot notices; on one, stop (drain) the runtime

Self-healing (the choice, in short): the supervisor is this file run as ``supervise``.

* Without systemd (the local stack's host slots, any plain host), ``start`` runs it detached; it
  launches the runtime as its child and restarts it when it exits or when liveness fails
  ``liveness_failures`` times in a row (:mod:`frontier_hostside.supervisor`); ``stop`` stops the
  supervisor, which stops the runtime.
* With systemd (EC2), the release's unit restarts a runtime that exits (``Restart=on-failure``), and
  ``start`` installs and runs ``frontier-agent.service``, a liveness watchdog that restarts the unit
  when liveness fails that many times (:mod:`frontier_hostside.watchdog`).

Either way (one base, :mod:`frontier_hostside.keeper`: the probing, the counting, the history)
the restarts are counted in ``run/supervisor.json`` (``status`` reports them) and each one is a
line in ``logs/agent.jsonl``. The interval, probe timeout and failure count are the stack's
health settings (``health.interval_s``, ``health.timeout_s``, ``health.unhealthy_threshold``).

The host layout follows releases/current::

    <root>/releases/<id>/     release.json, the rendered files, site/ (the wheel, installed)
    <root>/current, previous  symlinks to releases/<id>, swapped atomically (temp symlink + rename)
    <root>/releases.json      the release order, most recent first (staged or activated): prune reads
                              it, never file times; written atomically
    <root>/bin/               this file and its configuration (the systemd watchdog runs these)
    <root>/run/               runtime.pid, runtime.release, supervisor.pid, supervisor.json (restarts)
    <root>/logs/runtime.log   the runtime's (and the supervisor's) output (the process launcher only)
    <root>/logs/agent.jsonl   the supervisor's history: start, restart (why), recovered (after how long), stop
    <root>/env                KEY=VALUE lines added to the runtime's environment

A release directory that the order does not name (one staged before the order was kept) counts as
older than every release it names, so prune removes those first; current and previous never go.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from frontier_hostside import package_files
from frontier_hostside.interruption import IMDS_URL, IMDS_URL_ENV, POLL_INTERVAL_S, Imds, InterruptionWatcher
from frontier_hostside.names import (
    AGENT_CONFIG_NAME,
    AGENT_FILE_NAME,
    CURRENT_LINK,
    METRICS_PATH,
    PREVIOUS_LINK,
    RELEASES_DIR,
    RUNTIME_PID_NAME,
    SUPERVISE_COMMAND,
    SUPERVISOR_PID_NAME,
    SUPERVISOR_STATE_NAME,
    WATCHDOG_UNIT,
)
from frontier_hostside.processes import atomic_write, command_line, now, pid_alive, terminate_then_kill
from frontier_hostside.release_signature import (
    RELEASE_KEY_NAME,
    SIGNATURE_NAME,
    SignatureError,
    verify_release,
)
from frontier_hostside.supervisor import Supervisor
from frontier_hostside.watchdog import Watchdog
from frontier_hostside.weights_cache import evict_weights

# Where systemd announces itself and keeps local units (overridable to test the agent without it).
SYSTEMD_RUN_DIR_ENV = "FRONTIER_SYSTEMD_RUN_DIR"
UNIT_DIR_ENV = "FRONTIER_UNIT_DIR"
# The mark of a runtime process in its command line: a recycled pid never passes for the runtime.
RUNTIME_MODULE = "frontier_runtime"
LOG_TAIL_LINES = 40
# What the supervisor did, one JSON object a line (start, restart, recovered, stop).
HISTORY_NAME = "agent.jsonl"


class AgentError(Exception):
    """A step that cannot be done; ``code`` is the exit status, ``extra`` more JSON fields."""

    def __init__(self, message: str, code: int = 2, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


@dataclass(frozen=True)
class AgentConfig:
    """What the agent knows of its host and stack: rendered by the toolkit, one file per host."""

    stack: str
    host: str
    root: str
    python: str
    address: str
    port: int
    readiness_path: str
    liveness_path: str
    drain_timeout_s: float
    unit: str
    manifest: str
    release_id_pattern: str
    # The supervisor probes liveness every interval (each probe waiting up to the timeout) and
    # restarts the runtime after this many failed probes in a row (the stack's health settings).
    liveness_interval_s: float
    liveness_timeout_s: float
    liveness_failures: int
    # The watchdog's systemd unit (rendered from templates/frontier-agent.service.j2).
    watchdog_unit: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentConfig:
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise AgentError(f"agent config lacks {', '.join(missing)}")
        return cls(**{n: data[n] for n in names})

    @classmethod
    def load(cls, path: str) -> AgentConfig:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise AgentError(f"cannot read the agent config {path}: {exc}") from None
        return cls.from_dict(data)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


@dataclass
class Facts:
    """What a host runs and holds. ``ready``, ``live`` and ``digest`` are filled by ``status`` only."""

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
    # The supervisor: whether one watches the runtime, how often it restarted it, and why last.
    supervised: bool = False
    restarts: int = 0
    last_restart: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Facts:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def runs(self, release_id: str) -> bool:
        """The host's live runtime serves ``release_id`` (a stale record of a dead one does not count)."""
        return self.running and self.current == release_id and self.running_release == release_id


# --- the agent ------------------------------------------------------------------------------------


class Agent:
    """One host's release directory and runtime, as the configuration describes them."""

    def __init__(
        self, config: AgentConfig, config_path: str | None = None, environ: dict[str, str] | None = None
    ) -> None:
        # The environment the agent's commands and the runtime see (tests give stand-ins here).
        self.environ = environ = dict(os.environ if environ is None else environ)
        self.config = config
        # The supervisor is this file run again with the same configuration file.
        self.config_path = config_path
        self.root = Path(config.root)
        self.releases_dir = self.root / RELEASES_DIR
        self.order_file = self.root / "releases.json"
        self.run_dir = self.root / "run"
        self.pid_file = self.run_dir / RUNTIME_PID_NAME
        self.release_file = self.run_dir / "runtime.release"
        self.log_file = self.root / "logs" / "runtime.log"
        self.history_file = self.root / "logs" / HISTORY_NAME
        self.supervisor_pid_file = self.run_dir / SUPERVISOR_PID_NAME
        self.supervisor_state_file = self.run_dir / SUPERVISOR_STATE_NAME
        self._supervisor: subprocess.Popen[bytes] | None = None
        self.systemd_run_dir = Path(environ.get(SYSTEMD_RUN_DIR_ENV, "/run/systemd/system"))
        self.unit_dir = Path(environ.get(UNIT_DIR_ENV, "/etc/systemd/system"))
        self.unit = config.unit[: -len(".service")] if config.unit.endswith(".service") else config.unit
        self._release_id = re.compile(config.release_id_pattern)

    # --- the phases, one a command ----------------------------------------------------------------

    def facts(self, release_id: str = "") -> Facts:
        running = self.is_running()
        running_release = ""
        if running:
            with contextlib.suppress(OSError):
                running_release = self.release_file.read_text().strip()
        staged = ""
        if release_id:
            manifest = self.releases_dir / self.check_id(release_id, "facts") / self.config.manifest
            if manifest.is_file():
                staged = hashlib.sha256(manifest.read_bytes()).hexdigest()
        supervised = self.supervisor_pid() is not None
        state = self.supervisor_state() if supervised else {}
        last = state.get("last_restart") or {}
        systemd = self.systemd()
        restarts = int(state.get("restarts", 0))
        if systemd:
            # systemd restarts a runtime that exits by itself (Restart=on-failure) and counts those.
            shown = self.systemctl(
                "show", "-p", "NRestarts", "--value", self.unit, check=False
            ).stdout.strip()
            restarts += int(shown) if shown.isdigit() else 0
        return Facts(
            current=self.link(CURRENT_LINK),
            previous=self.link(PREVIOUS_LINK),
            systemd=systemd,
            running=running,
            running_release=running_release,
            releases=self.order(),
            staged_manifest=staged,
            supervised=supervised,
            restarts=restarts,
            last_restart=f"{last.get('at', '')} {last.get('reason', '')}".strip(),
        )

    def stage(self, release_id: str, incoming: str, wheel: str = "") -> dict[str, Any]:
        """Verify an uploaded release directory, install its wheel, and move it into releases/."""
        self.check_id(release_id, "stage")
        source = Path(incoming)
        manifest = source / self.config.manifest
        if not manifest.is_file():
            raise AgentError(f"stage: {manifest} is missing")
        # The signature first (release.json is what it covers), then every file against the hash
        # release.json gives it: nothing half-uploaded or altered is ever activated.
        self.check_signature("stage", release_id, source)
        self.check_files("stage", source)
        if wheel:
            done = subprocess.run(
                [
                    self.config.python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", str(source / "site"), wheel,
                ],
                capture_output=True,
                text=True,
                env=self.environ,
            )  # fmt: skip
            if done.returncode != 0:
                raise AgentError(f"stage: pip cannot install {wheel}: {(done.stderr or done.stdout).strip()}")
        self.releases_dir.mkdir(parents=True, exist_ok=True)
        target = self.releases_dir / release_id
        if target.exists():
            shutil.rmtree(target)
        # A rename where the upload is on the same filesystem, a copy where it is not (sudo uploads to /tmp).
        shutil.move(str(source), str(target))
        self._touch_order(release_id)
        return {"staged": release_id}

    def activate(self, release_id: str) -> dict[str, Any]:
        self.check_id(release_id, "activate")
        if not (self.releases_dir / release_id / self.config.manifest).is_file():
            raise AgentError(f"activate: release {release_id} is not staged")
        # Again here: a staged release's files may have been changed since it was staged.
        release_dir = self.releases_dir / release_id
        self.check_signature("activate", release_id, release_dir)
        self.check_files("activate", release_dir)
        old = self.link(CURRENT_LINK)
        if old and old != release_id:
            _atomic_symlink(self.root / PREVIOUS_LINK, f"{RELEASES_DIR}/{old}")
        _atomic_symlink(self.root / CURRENT_LINK, f"{RELEASES_DIR}/{release_id}")
        self._touch_order(release_id)
        return {"current": release_id, "previous": self.link(PREVIOUS_LINK)}

    def start(self) -> dict[str, Any]:
        release = self.current_release("start")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        if not self.is_running():
            # A port another process holds fails the runtime only once it has loaded its weights
            # (minutes on a GPU host), and then as a readiness timeout: say it before starting.
            self._check_port_free()
        if self.systemd():
            self.unit_dir.mkdir(parents=True, exist_ok=True)
            unit_file = self.unit_dir / f"{self.unit}.service"
            shutil.copyfile(release / f"{self.unit}.service", unit_file)
            os.chmod(unit_file, 0o644)
            watchdog_changed = self._install_watchdog()
            self.systemctl("daemon-reload")
            self.systemctl("restart", self.unit)
            self.systemctl("enable", f"{WATCHDOG_UNIT}.service")
            self.systemctl("restart" if watchdog_changed else "start", f"{WATCHDOG_UNIT}.service")
            atomic_write(self.release_file, release.name + "\n")
            return {"started": release.name, "pid": None, "launcher": "systemd"}
        running = self.running_pid() or self.supervisor_pid()
        if running is not None:
            raise AgentError(f"start: the runtime already runs (pid {running}); stop it first")
        supervisor = self._start_supervisor()
        pid = self._wait_launched(supervisor)
        return {"started": release.name, "pid": pid, "supervisor": supervisor.pid, "launcher": "process"}

    def _check_port_free(self) -> None:
        address, port = self.config.address, self.config.port
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
            # As the runtime's server binds: a port in TIME_WAIT from the last runtime is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                raise AgentError(
                    f"start: port = {port} on {address} is in use by another process: the runtime "
                    "could not listen there; stop that process, or give the stack another runtime.port"
                ) from None

    def _install_watchdog(self) -> bool:
        """The agent, the package files it imports, its configuration and the watchdog unit under
        <root>/bin; True when any changed.

        The agent may run from an upload folder (``/tmp`` for a non-root SSH user): the watchdog
        runs from a copy under the root, which outlives that folder.
        """
        bin_dir = self.root / "bin"
        wanted = {
            bin_dir / AGENT_FILE_NAME: Path(os.path.abspath(__file__)).read_bytes(),
            **{bin_dir / name: data for name, data in package_files().items()},
            bin_dir / AGENT_CONFIG_NAME: self.config.to_json().encode(),
            self.unit_dir / f"{WATCHDOG_UNIT}.service": self.config.watchdog_unit.encode(),
        }
        changed = False
        for path, data in wanted.items():
            if not path.exists() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_bytes(data)
                os.chmod(tmp, 0o755 if path.name == AGENT_FILE_NAME else 0o644)
                os.replace(tmp, path)
                changed = True
        return changed

    def _start_supervisor(self) -> subprocess.Popen[bytes]:
        if not self.config_path:
            raise AgentError("start: the supervisor needs the agent's configuration file; none was given")
        for stale in (self.pid_file, self.release_file, self.supervisor_state_file):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        with self.log_file.open("ab") as log:
            # A new session: the supervisor (and the runtime under it) outlive this command and the
            # SSH session that ran it.
            self._supervisor = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--config", self.config_path, SUPERVISE_COMMAND],
                cwd=str(self.root),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self._supervisor

    def _wait_launched(self, supervisor: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
        """The runtime's pid once the supervisor has launched it and recorded it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.supervisor_state()
            if state.get("pid") == supervisor.pid and state.get("runtime_pid"):
                return int(state["runtime_pid"])
            if supervisor.poll() is not None:
                raise AgentError(
                    f"start: the supervisor exited with status {supervisor.returncode}",
                    log_tail=self.log_tail(),
                )
            time.sleep(0.02)
        raise AgentError(
            f"start: the supervisor launched no runtime within {timeout:g}s", log_tail=self.log_tail()
        )

    def stop(self) -> dict[str, Any]:
        if self.systemd():
            self.systemctl("stop", self.unit, check=False)
            with contextlib.suppress(FileNotFoundError):
                self.release_file.unlink()
            return {"stopped": True, "pid": None, "outcome": "stopped"}
        pid = self.running_pid()
        outcome = "absent"
        supervisor = self.supervisor_pid()
        if supervisor is not None:
            # The supervisor stops its runtime (SIGTERM, drain, SIGKILL) and says how that went.
            own = self._supervisor if self._supervisor and self._supervisor.pid == supervisor else None
            terminate_then_kill(
                supervisor,
                self.config.drain_timeout_s + 10,
                still_ours=lambda: _is_supervisor(supervisor),
                process=own,
            )
            outcome = str(self.supervisor_state().get("stop_outcome", outcome))
        left = self.running_pid()
        if left is not None:
            # A runtime without its supervisor (one killed, or a runtime started before there was one).
            # SIGTERM: the runtime turns unready, finishes in-flight requests within its drain
            # timeout and exits; SIGKILL only if it outlives that by 5 s.
            outcome = terminate_then_kill(
                left, self.config.drain_timeout_s + 5, still_ours=lambda: RUNTIME_MODULE in command_line(left)
            )
        for path in (self.pid_file, self.release_file, self.supervisor_pid_file, self.supervisor_state_file):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return {"stopped": True, "pid": pid, "outcome": outcome}

    def prefetch(self, release_id: str = "") -> dict[str, Any]:
        """Warm the host's weights cache for a staged release (default: the current one) without
        starting it: the release's runtime fetches and verifies what its start will read (the
        prepared weights of its key where S3 holds them, else the checkpoint) and exits, so that
        start reads the cache only. The runtime's log lines go to the runtime log."""
        if release_id:
            self.check_id(release_id, "prefetch")
            release = self.releases_dir / release_id
            if not (release / self.config.manifest).is_file():
                raise AgentError(f"prefetch: release {release_id} is not staged")
        else:
            release = self.current_release("prefetch")
        self.check_signature("prefetch", release.name, release)
        self.check_files("prefetch", release)
        if not (release / "site").is_dir():
            # An image release's runtime is in its image, which this agent does not run.
            raise AgentError(
                f"prefetch: release {release.name} has no runtime installed beside it ({release / 'site'}); "
                "a release of an image prefetches nothing here"
            )
        env = dict(self.environ)
        env.update(_read_env_file(self.root / "env"))
        env["PYTHONPATH"] = str(release / "site")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"=== {now()} prefetch {release.name}\n".encode())
            log.flush()
            done = subprocess.run(
                [self.config.python, "-m", RUNTIME_MODULE, "prefetch", "--config", str(release / "runtime.yaml")],
                cwd=str(self.root),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )  # fmt: skip
        lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith("{")]
        try:
            answer: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if done.returncode != 0 or not answer.get("ok"):
            why = answer.get("error") or f"the runtime's prefetch exited {done.returncode}"
            raise AgentError(f"prefetch: {why}", log_tail=self.log_tail())
        answer.pop("ok", None)
        return {"prefetched": release.name, **answer}

    def supervise(self) -> dict[str, Any]:
        if self.systemd():
            return Watchdog(self).run()
        return Supervisor(self, self.current_release("supervise")).run()

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        started = time.monotonic()
        while True:
            if self.http_status(self.config.readiness_path) == 200:
                return {"ready": True, "after_s": round(time.monotonic() - started, 3)}
            if not self.is_running() or self.supervisor_state().get("exits_before_ready"):
                raise AgentError(
                    "the runtime exited during start-up", code=3, ready=False, log_tail=self.log_tail()
                )
            if time.monotonic() - started >= timeout:
                raise AgentError(
                    f"not ready after {timeout:g}s", code=4, ready=False, log_tail=self.log_tail()
                )
            time.sleep(0.2)

    def metrics(self) -> dict[str, Any]:
        url = f"http://{self.config.address}:{self.config.port}{METRICS_PATH}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=5) as response:
                return {"metrics": response.read().decode()}
        except (OSError, ValueError) as exc:
            raise AgentError(f"metrics: {url}: {exc}") from None

    def status(self) -> Facts:
        facts = self.facts()
        facts.ready = self.http_status(self.config.readiness_path) == 200
        facts.live = self.http_status(self.config.liveness_path) == 200
        with contextlib.suppress(OSError, ValueError, KeyError):
            facts.digest = json.loads((self.root / CURRENT_LINK / self.config.manifest).read_text())["digest"]
        return facts

    def prune(self, keep: int) -> dict[str, Any]:
        """Remove all but the ``keep`` most recent releases; current and previous always stay."""
        if keep < 1:
            raise AgentError(f"prune: keep is {keep}; it must be at least 1")
        if self.releases_dir.is_dir():
            for leftover in self.releases_dir.glob(".incoming-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        kept = {self.link(CURRENT_LINK), self.link(PREVIOUS_LINK)} - {""}
        removed = []
        for n, release_id in enumerate(self.order(), start=1):
            if n > keep and release_id not in kept:
                shutil.rmtree(self.releases_dir / release_id)
                removed.append(release_id)
        if removed:
            atomic_write(self.order_file, json.dumps({"releases": self.order()}, indent=2) + "\n")
        return {"pruned": removed, **evict_weights(self.root, self.releases_dir)}

    # --- the release directory --------------------------------------------------------------------

    def check_signature(self, phase: str, release_id: str, directory: Path) -> None:
        """Refuse a release that the stack's release key did not sign.

        The key is ``<root>/release-key.pub``, written when the host is provisioned (the bootstrap
        or ``local.up`` reads it with kms:GetPublicKey), never by a deploy. A host without one
        belongs to a stack with no release key: its releases are held to their manifest only.
        """
        key_file = self.root / RELEASE_KEY_NAME
        if not key_file.is_file():
            return
        key = key_file.read_text().strip()
        signature = directory / SIGNATURE_NAME
        if not signature.is_file():
            raise AgentError(
                f"{phase}: release {release_id} is unsigned ({SIGNATURE_NAME} is missing); refused"
            )
        manifest = (directory / self.config.manifest).read_bytes()
        try:
            verify_release(key, self.config.stack, release_id, manifest, signature.read_text())
        except SignatureError as exc:
            raise AgentError(f"{phase}: {exc}; refused") from None

    def check_files(self, phase: str, directory: Path) -> None:
        """Every file must match the hash release.json gives it."""
        manifest = directory / self.config.manifest
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError) as exc:
            raise AgentError(f"{phase}: {manifest} is not a release manifest ({exc})") from None
        for name, want in sorted(files.items()):
            path = directory / name
            got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "(missing)"
            if got != want:
                raise AgentError(f"{phase}: {name} has sha256 {got}, {self.config.manifest} says {want}")

    def check_id(self, release_id: str, phase: str) -> str:
        if not self._release_id.match(release_id):
            raise AgentError(
                f"{phase}: {release_id!r} is not a release id (pattern {self.config.release_id_pattern})"
            )
        return release_id

    def current_release(self, phase: str) -> Path:
        current = self.root / CURRENT_LINK
        release = Path(os.path.realpath(current)) if current.is_symlink() else None
        if release is None or not release.is_dir():
            raise AgentError(f"{phase}: no current release under {self.root}")
        return release

    def link(self, name: str) -> str:
        """The release id a symlink (``current``/``previous``) points at, or ''."""
        try:
            return os.path.basename(os.readlink(self.root / name))
        except OSError:
            return ""

    def order(self) -> list[str]:
        """Every release directory, most recent first: the recorded order, then unrecorded ones."""
        try:
            recorded = [str(i) for i in json.loads(self.order_file.read_text())["releases"]]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = []
        present = set()
        if self.releases_dir.is_dir():
            present = {
                p.name for p in self.releases_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
            }
        return [i for i in recorded if i in present] + sorted(present - set(recorded))

    def _touch_order(self, release_id: str) -> None:
        order = [release_id] + [i for i in self.order() if i != release_id]
        atomic_write(self.order_file, json.dumps({"releases": order}, indent=2) + "\n")

    # --- the runtime: how it runs, how it answers -------------------------------------------------

    def launch(self, release: Path, word: str = "start") -> subprocess.Popen[bytes]:
        """The runtime of ``release`` as a child of this process; its output goes to the runtime log."""
        env = dict(self.environ)
        env.update(_read_env_file(self.root / "env"))
        env["PYTHONPATH"] = str(release / "site")
        with self.log_file.open("ab") as log:
            log.write(f"=== {now()} {word} {release.name}\n".encode())
            log.flush()
            process = subprocess.Popen(
                [
                    self.config.python, "-m", RUNTIME_MODULE, "serve", "--config", str(release / "runtime.yaml"),
                    "--host", self.config.address, "--port", str(self.config.port),
                ],
                cwd=str(self.root),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        atomic_write(self.pid_file, f"{process.pid}\n")
        atomic_write(self.release_file, release.name + "\n")
        return process

    def systemd(self) -> bool:
        return (
            self.systemd_run_dir.is_dir()
            and shutil.which("systemctl", path=self.environ.get("PATH")) is not None
        )

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["systemctl", *args], capture_output=True, text=True, env=self.environ)
        if check and done.returncode != 0:
            raise AgentError(f"systemctl {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
        return done

    def is_running(self) -> bool:
        if self.systemd():
            return self.systemctl("is-active", "--quiet", self.unit, check=False).returncode == 0
        return self.running_pid() is not None

    def running_pid(self) -> int | None:
        """The pid of the runtime this agent started, if it still runs (a recycled pid does not count)."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if pid_alive(pid) and RUNTIME_MODULE in command_line(pid):
            return pid
        return None

    def supervisor_pid(self) -> int | None:
        """The pid of this host's supervisor, if it runs."""
        try:
            pid = int(self.supervisor_pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if pid_alive(pid) and _is_supervisor(pid):
            return pid
        return None

    def supervisor_state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.supervisor_state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return {}

    def http_status(self, path: str, timeout: float = 2.0) -> int:
        url = f"http://{self.config.address}:{self.config.port}{path}"
        # No proxy: the runtime is on this host, whatever http_proxy says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (OSError, ValueError):
            return 0

    def log_tail(self) -> str:
        if self.systemd():
            if shutil.which("journalctl", path=self.environ.get("PATH")) is None:
                return ""
            done = subprocess.run(
                ["journalctl", "-u", self.unit, "-n", str(LOG_TAIL_LINES), "--no-pager"],
                capture_output=True,
                text=True,
                env=self.environ,
            )
            return done.stdout
        if self.log_file.exists():
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        return ""


def _is_supervisor(pid: int) -> bool:
    words = command_line(pid).split()
    return SUPERVISE_COMMAND in words and any(
        w.endswith(".py") and "agent" in os.path.basename(w) for w in words
    )


def _read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` and quotes allowed, ``#`` comments), as a shell would source them."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def _atomic_symlink(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


# --- the command line -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frontier-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        default=str(Path(__file__).resolve().with_name(AGENT_CONFIG_NAME)),
        help=f"the rendered configuration (default: {AGENT_CONFIG_NAME} beside this file)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("facts")
    p.add_argument("--release", default="")
    p = sub.add_parser("stage")
    p.add_argument("release")
    p.add_argument("dir")
    p.add_argument("--wheel", default="")
    p = sub.add_parser("activate")
    p.add_argument("release")
    p = sub.add_parser("start")
    p.add_argument("--activate", default="")
    sub.add_parser("stop")
    p = sub.add_parser("wait-ready")
    p.add_argument("seconds", type=float)
    sub.add_parser("metrics")
    sub.add_parser("status")
    p = sub.add_parser("prune")
    p.add_argument("keep", type=int)
    sub.add_parser(SUPERVISE_COMMAND)
    p = sub.add_parser("prefetch")
    p.add_argument("--release", default="")
    # Spot notices from IMDS take the host out of service (frontier_hostside.interruption).
    p = sub.add_parser("interruptions")
    p.add_argument("--imds", default=os.environ.get(IMDS_URL_ENV, IMDS_URL))
    p.add_argument("--interval", type=float, default=POLL_INTERVAL_S)
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--drain-on-rebalance", action="store_true")
    p.add_argument("--gateway-admin", action="append", default=[], help="a gateway's admin URL to tell (repeat)")
    return parser


def run(agent: Agent, args: argparse.Namespace) -> dict[str, Any]:
    """One subcommand on ``agent``; the JSON-ready result."""
    command = args.command
    if command == "facts":
        return asdict(agent.facts(args.release))
    if command == "stage":
        return agent.stage(args.release, args.dir, args.wheel)
    if command == "activate":
        return agent.activate(args.release)
    if command == "start":
        activated = agent.activate(args.activate) if args.activate else {}
        return {**activated, **agent.start()}
    if command == "stop":
        return agent.stop()
    if command == "wait-ready":
        return agent.wait_ready(args.seconds)
    if command == "metrics":
        return agent.metrics()
    if command == "status":
        return asdict(agent.status())
    if command == "prune":
        return agent.prune(args.keep)
    if command == SUPERVISE_COMMAND:
        return agent.supervise()
    if command == "prefetch":
        return agent.prefetch(args.release)
    if command == "interruptions":
        try:
            watcher = InterruptionWatcher(
                agent, Imds(args.imds), args.interval, args.drain_on_rebalance,
                gateway_admin=tuple(args.gateway_admin),
            )  # fmt: skip
        except ValueError as exc:
            raise AgentError(f"interruptions: {exc}") from None
        return watcher.run(args.rounds)
    raise AgentError(f"unknown command {command!r}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = run(Agent(AgentConfig.load(args.config), args.config), args)
    except AgentError as exc:
        print(json.dumps({"ok": False, "phase": args.command, "error": str(exc), **exc.extra}))
        return exc.code
    except OSError as exc:
        # A filesystem or process error is the host's answer: report it as such, not as a traceback.
        reason = f"{errno.errorcode.get(exc.errno or 0, type(exc).__name__)}: {exc}"
        print(json.dumps({"ok": False, "phase": args.command, "error": reason}))
        return 2
    print(json.dumps({"ok": True, "phase": args.command, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
