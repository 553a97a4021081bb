"""Local service processes: sshd, HAProxy and moto's server, started and stopped by hand.

The embedded local stack and the end-to-end tests run real daemons on this machine. Each one is a
:class:`Service`: a process (or, for moto in a test, a server thread) with a pid file and a log
under a state directory, a health wait after start, and a clear error when its port is already
taken or its package is missing. A service started by one command can be found and stopped by
another (:func:`find`, :func:`stop`), so ``up``/``down`` style tasks are idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from frontier_hostside import agent
from frontier_hostside.agent import terminate_then_kill

from frontier.errors import FrontierError

SSHD = "/usr/sbin/sshd"


class ServiceError(FrontierError):
    """A service that cannot start or stop: missing package, port taken, failed health check."""


@dataclass
class Service:
    """One running service. ``pid`` is None for an in-process (threaded) server."""

    name: str
    pid: int | None
    address: str
    port: int
    state_dir: str
    log_file: str = ""
    command: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    handle: Any = field(default=None, repr=False, compare=False)

    @property
    def pid_file(self) -> Path:
        return Path(self.state_dir) / f"{self.name}.pid"

    @property
    def record_file(self) -> Path:
        return Path(self.state_dir) / f"{self.name}.json"

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port}"

    def alive(self) -> bool:
        if self.handle is not None:
            return True
        return self.pid is not None and pid_alive(self.pid)


# --- checks -------------------------------------------------------------------------------------


def require_binary(path_or_name: str, package: str) -> str:
    """Return the executable's path, or fail naming the Debian package that provides it."""
    found = path_or_name if os.path.isabs(path_or_name) and os.access(path_or_name, os.X_OK) else None
    found = found or shutil.which(os.path.basename(path_or_name))
    if not found:
        raise ServiceError(
            f"{os.path.basename(path_or_name)} is not installed: install the Debian package "
            f"{package!r} (apt-get install -y {package})"
        )
    return found


def require_python_module(module: str, package: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise ServiceError(
            f"Python module {module!r} is missing: install {package!r} into this environment "
            f"({sys.executable} -m pip install '{package}')"
        ) from None


def port_in_use(address: str, port: int) -> bool:
    """True when something accepts connections on address:port or the port cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        if sock.connect_ex((address, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return True
    return False


def require_free_port(address: str, port: int, what: str) -> None:
    if port_in_use(address, port):
        holder = _port_holder(port)
        raise ServiceError(
            f"{what}: port {address}:{port} is already taken{holder}; stop that process or choose "
            f"another port"
        )


def free_port(address: str = "127.0.0.1") -> int:
    """An unused TCP port on ``address`` (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def wait_until(
    ready: Callable[[], bool],
    timeout: float,
    failure: str,
    service: Service | None = None,
    *,
    poll_s: float = 0.05,
    stop_on_failure: bool = False,
) -> None:
    """Poll ``ready`` until it holds; fail with ``failure`` at the deadline or when ``service`` dies.

    Every start-up wait of this module is this loop with its own readiness probe.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service is not None and not service.alive():
            raise ServiceError(f"{service.name} exited during start-up{_log_tail(service)}")
        if ready():
            return
        time.sleep(poll_s)
    if service is not None and stop_on_failure:
        stop(service)
    raise ServiceError(f"{failure} within {timeout:.0f}s{_log_tail(service)}")


def _listens(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address, port)) == 0


def wait_for_port(address: str, port: int, timeout: float, service: Service | None = None) -> None:
    name = service.name if service else "service"
    wait_until(
        lambda: _listens(address, port), timeout, f"{name} did not listen on {address}:{port}", service
    )


# --- sshd -------------------------------------------------------------------------------------


def start_sshd(
    address: str,
    port: int,
    state_dir: str | Path,
    authorized_key: str,
    *,
    name: str | None = None,
    set_env: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Service:
    """Run a private sshd on ``address:port`` that admits ``authorized_key`` (a public key line).

    The daemon has its own host key, pid file, log and authorized_keys under ``state_dir``, refuses
    passwords, and serves sftp in-process. ``set_env`` is passed to every session (``SetEnv``).
    """
    sshd = require_binary(SSHD, "openssh-server")
    keygen = require_binary("ssh-keygen", "openssh-client")
    name = name or f"sshd-{address}-{port}"
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    require_free_port(address, port, name)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory

    host_key = state / f"{name}.host_key"
    if not host_key.exists():
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    keys = state / f"{name}.authorized_keys"
    keys.write_text(authorized_key.strip() + "\n")
    keys.chmod(0o600)
    config = state / f"{name}.sshd_config"
    lines = [
        f"ListenAddress {address}:{port}",
        f"HostKey {host_key}",
        f"PidFile {state / (name + '.sshd.pid')}",
        f"AuthorizedKeysFile {keys}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "MaxStartups 100:30:200",
        "MaxSessions 50",
        "Subsystem sftp internal-sftp",
    ]
    if set_env:
        lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in set_env.items()))
    config.write_text("\n".join(lines) + "\n")
    config.chmod(0o600)  # SetEnv may carry an access key
    check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise ServiceError(f"{name}: sshd refuses its config {config}: {check.stderr.strip()}")

    log = state / f"{name}.log"
    service = _spawn(name, [sshd, "-D", "-f", str(config), "-E", str(log)], state, log, address, port)
    _wait_banner(service, timeout)
    return service


def sshd_session_env(state_dir: str | Path, name: str) -> dict[str, str]:
    """What the sshd ``name`` under ``state_dir`` hands every session (its config's ``SetEnv``)."""
    config = Path(state_dir).resolve() / f"{name}.sshd_config"
    with contextlib.suppress(OSError):
        for line in config.read_text().splitlines():
            if line.startswith("SetEnv "):
                return dict(pair.split("=", 1) for pair in line.removeprefix("SetEnv ").split())
    return {}


def _wait_banner(service: Service, timeout: float) -> None:
    def banner() -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection((service.address, service.port), 0.5) as s,
        ):
            s.settimeout(1.0)
            return s.recv(64).startswith(b"SSH-")
        return False

    wait_until(banner, timeout, f"{service.name} gave no SSH banner", service, stop_on_failure=True)


# --- haproxy ------------------------------------------------------------------------------------

_BIND = re.compile(r"^\s*bind\s+(\S+):(\d+)", re.MULTILINE)
_SOCKET = re.compile(r"^\s*stats\s+socket\s+(\S+)", re.MULTILINE)


def start_haproxy(
    config_path: str | Path,
    state_dir: str | Path,
    *,
    name: str = "haproxy",
    cwd: str | Path | None = None,
    timeout: float = 10.0,
) -> Service:
    """Run HAProxy in the foreground (``-db``) on a config file; wait for its binds and admin socket.

    The config is checked first (``haproxy -c``) so a mistake is reported with HAProxy's own words.
    Relative paths in the config (``unix@path`` sockets) resolve against ``cwd`` (default: here).
    The admin socket's absolute path is ``service.extra["admin_socket"]``.
    """
    workdir = Path(cwd or os.getcwd()).resolve()
    haproxy = require_binary("haproxy", "haproxy")
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    config = Path(config_path).resolve()
    text = config.read_text()
    binds = [
        (addr if addr not in ("*", "") else "127.0.0.1", int(port)) for addr, port in _BIND.findall(text)
    ]
    if not binds:
        raise ServiceError(f"{config}: no 'bind ADDRESS:PORT' line; HAProxy would listen nowhere")
    for addr, port in binds:
        require_free_port(addr, port, name)
    check = subprocess.run(
        [haproxy, "-c", "-q", "-f", str(config)], capture_output=True, text=True, cwd=workdir
    )
    if check.returncode != 0:
        raise ServiceError(f"{name}: HAProxy refuses {config}:\n{(check.stderr or check.stdout).strip()}")
    match = _SOCKET.search(text)
    admin = workdir / match.group(1).removeprefix("unix@") if match else None
    if admin is not None:
        admin.parent.mkdir(parents=True, exist_ok=True)
    log = state / f"{name}.log"
    address, port = binds[0]
    service = _spawn(name, [haproxy, "-db", "-f", str(config)], state, log, address, port, cwd=workdir)
    service.extra = {"config": str(config), "admin_socket": str(admin or ""), "binds": binds}
    _write_record(service)
    for addr, bind_port in binds:
        wait_for_port(addr, bind_port, timeout, service)
    if admin is not None:
        _wait_path(admin, timeout, service)
    return service


def _wait_path(path: Path, timeout: float, service: Service) -> None:
    wait_until(
        path.exists,
        timeout,
        f"{service.name}: admin socket {path} did not appear",
        service,
        stop_on_failure=True,
    )


# --- moto ---------------------------------------------------------------------------------------


def start_moto(
    port: int,
    state_dir: str | Path,
    *,
    address: str = "127.0.0.1",
    in_process: bool = False,
    name: str = "moto",
    timeout: float = 20.0,
    env: dict[str, str] | None = None,
) -> Service:
    """moto's server standing in for AWS: a subprocess (outlives this command) or an in-process thread.

    ``port=0`` picks a free port. In-process mode (``ThreadedMotoServer``) starts in milliseconds
    and suits tests; the subprocess suits a local stack that must keep running after the command.
    ``env`` adds to the subprocess's environment (moto reads its settings, such as IAM enforcement,
    from there). The subprocess appends every call its IAM enforcement allows to
    :func:`call_log` (:mod:`frontier.targets.local.moto_calls`): what AWS would evaluate, conditions'
    context included, for the tests to check against the unwidened documents.
    """
    require_python_module("moto.server", "moto[server]")
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    if port:
        require_free_port(address, port, name)
    if in_process:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address=address, port=port, verbose=False)
        server.start()
        _, bound = server.get_host_and_port()
        service = Service(name, None, address, int(bound), str(state), handle=server)
    else:
        port = port or free_port(address)
        log = state / f"{name}.log"
        command = [
            sys.executable,
            "-m",
            "frontier.targets.local.moto_calls",
            "--log",
            str(call_log(state, name)),
        ]
        command += ["-H", address, "-p", str(port)]
        service = _spawn(name, command, state, log, address, port, env={**os.environ, **env} if env else None)
    _wait_http(f"{service.endpoint}/moto-api/data.json", timeout, service)
    return service


def call_log(state_dir: str | Path, name: str = "moto") -> Path:
    """The log of the calls moto's server ``name`` under ``state_dir`` allowed, one JSON line each."""
    return Path(state_dir).resolve() / f"{name}-calls.jsonl"


def _wait_http(url: str, timeout: float, service: Service) -> None:
    def answers() -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
        return False

    wait_until(
        answers, timeout, f"{service.name}: {url} did not answer", service, poll_s=0.1, stop_on_failure=True
    )


# --- lifecycle ----------------------------------------------------------------------------------


def stop(service: Service, timeout: float = 10.0) -> None:
    """Stop a service: SIGTERM, wait, then SIGKILL; remove its pid file and record. Idempotent."""
    if service.handle is not None:
        service.handle.stop()
        service.handle = None
    elif service.pid is not None:
        terminate_then_kill(
            service.pid,
            timeout,
            still_ours=lambda: _same_process(service),
            process=_CHILDREN.pop(service.pid, None),
        )
    for path in (service.pid_file, service.record_file):
        path.unlink(missing_ok=True)


def find(state_dir: str | Path, name: str) -> Service | None:
    """The service ``name`` recorded under ``state_dir`` if its process still runs, else None."""
    record = Path(state_dir).resolve() / f"{name}.json"
    if not record.exists():
        return None
    try:
        service = Service(**json.loads(record.read_text()))
    except (ValueError, TypeError):
        return None
    if service.pid is None or not pid_alive(service.pid) or not _same_process(service):
        return None
    return service


def spawn(
    name: str, command: list[str], state: Path, log: Path, address: str, port: int, *, env: dict | None = None
) -> Service:
    """Start another daemon of the local stack (the gateway), recorded like the built-in ones."""
    return _spawn(name, command, state, log, address, port, env=env)


def _spawn(
    name: str,
    command: list[str],
    state: Path,
    log: Path,
    address: str,
    port: int,
    cwd: Path | None = None,
    env: dict | None = None,
) -> Service:
    with log.open("ab") as out:
        # A new session: the daemon outlives the command that started it and ignores its terminal.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )
    service = Service(name, process.pid, address, port, str(state), str(log), command)
    service.pid_file.write_text(f"{process.pid}\n")
    _write_record(service)
    _CHILDREN[process.pid] = process
    return service


# Popen objects of daemons started here, so their exit status is collected (no zombies).
_CHILDREN: dict[int, subprocess.Popen] = {}


def _write_record(service: Service) -> None:
    data = asdict(service)
    data.pop("handle", None)
    service.record_file.write_text(json.dumps(data, indent=2) + "\n")


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (children started here are polled, so they are reaped)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    return agent.pid_alive(pid)


def _same_process(service: Service) -> bool:
    """Guard against a recycled pid: the process's command line must match the one started."""
    if not service.command:
        return True
    try:
        cmdline = Path(f"/proc/{service.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    program = os.path.basename(service.command[0])
    first = cmdline[0].decode(errors="replace")
    # sshd retitles its listener "sshd: /usr/sbin/sshd -D -f ... [listener] ...".
    return os.path.basename(first) == program or first.startswith(f"{program}: ")


def _port_holder(port: int) -> str:
    """' by <process> (pid N)' when ss can tell, else ''."""
    ss = shutil.which("ss")
    if not ss:
        return ""
    out = subprocess.run([ss, "-Htlnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    match = re.search(r'users:\(\("([^"]+)",pid=(\d+)', out)
    return f" by {match.group(1)} (pid {match.group(2)})" if match else ""


def _log_tail(service: Service | None, lines: int = 15) -> str:
    if service is None or not service.log_file or not Path(service.log_file).exists():
        return ""
    tail = Path(service.log_file).read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {service.log_file}:\n" + "\n".join(tail) if tail else ""
