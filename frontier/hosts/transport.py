"""SSH to a host through a command instead of a TCP port, with a key made for this run.

A host that accepts no inbound connection is still reachable through a program that carries the
SSH bytes on its standard input and output (OpenSSH's ``ProxyCommand``): Session Manager's
``aws ssm start-session`` on EC2, ``socat``/``nc`` to a loopback sshd in the tests. The target
decides the command (:mod:`frontier.targets.ec2.access`); this module only runs it:

- :class:`ProxyProcess` is paramiko's ``ProxyCommand`` that keeps the command's standard error, so
  a proxy that ends early (no such target, no permission, no plugin) is reported in its own words
  instead of as a banner timeout;
- :class:`PreparedConnection` is a Fabric connection that runs a hook (deliver the key) every time
  it opens, and :class:`ProxiedConnection` one that also starts a fresh proxy then, so a reconnect
  gets both again;
- :func:`ephemeral_key` makes the Ed25519 key of one ``fab`` run: nothing long-lived to store,
  rotate or leak, and no key file on the operator's machine.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import StringIO
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fabric import Connection
from paramiko.proxy import ProxyCommand

from frontier.errors import FrontierError


class TransportError(FrontierError):
    """The way to a host could not be opened; the message says which step and why."""


@dataclass(frozen=True)
class SessionKey:
    """An SSH key pair made for one run: ``pkey`` signs, ``public`` is the authorized_keys line."""

    pkey: paramiko.PKey
    public: str


def ephemeral_key(comment: str) -> SessionKey:
    """A new Ed25519 key pair (paramiko cannot make Ed25519 keys itself; cryptography can)."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return SessionKey(paramiko.Ed25519Key.from_private_key(StringIO(pem)), f"{public.decode()} {comment}")


class ProxyProcess(ProxyCommand):
    """``argv`` as a socket: its stdin and stdout carry the SSH stream; stderr is kept for errors."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        # Not paramiko's __init__: it takes one shell-quoted string and pipes stderr, which nobody
        # reads (a chatty proxy would block on a full pipe).
        self.cmd = list(argv)
        self.timeout: float | None = None
        self._last_words = ""
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the proxy; close() ends it
        try:
            self.process = subprocess.Popen(
                self.cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                bufsize=0,
                env=env,
            )
        except OSError as exc:
            self._stderr.close()
            raise TransportError(f"cannot start {shlex.join(self.cmd)}: {exc.strerror or exc}") from None

    def stderr_text(self) -> str:
        """What the command wrote to its standard error so far, stripped."""
        # paramiko's reader thread may ask while close() runs on the caller's: a file closed between
        # the check and the read has already left its last words.
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace").strip()
        except ValueError:
            return self._last_words

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer at the timeout); EOFError once the proxy has ended.

        paramiko's version reads an ended proxy's empty stdout again and again until its banner
        timeout, and then reports only that.
        """
        started, buffer = time.monotonic(), b""
        stdout = self.process.stdout
        assert stdout is not None
        while len(buffer) < size:
            wait = None
            if self.timeout is not None:
                wait = self.timeout - (time.monotonic() - started)
                if wait <= 0:
                    if buffer:
                        return buffer
                    raise TimeoutError("the proxy command sent nothing in time")
            try:
                ready, _, _ = select.select([stdout], [], [], wait)
                if not ready:
                    continue
                chunk = os.read(stdout.fileno(), size - len(buffer))
            except (ValueError, OSError):
                # close() on another thread closed the pipe: the connection has ended.
                raise EOFError("the proxy command ended") from None
            if not chunk:
                if buffer:
                    return buffer
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=2)  # its last words reach stderr before it exits
                # EOF, as from a socket: paramiko ends its reader quietly on a closed connection, and
                # a connection that was opening fails (ProxiedConnection.open adds the proxy's words).
                raise EOFError(self.stderr_text() or "the proxy command ended")
            buffer += chunk
        return buffer

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        # paramiko closes its socket when the handshake fails, before the caller asks why.
        if not self._stderr.closed:
            self._last_words = self.stderr_text()
            self._stderr.close()


class PreparedConnection(Connection):
    """A Fabric connection that runs ``before_open`` (deliver the key) every time it opens."""

    def __init__(self, host: str, *, before_open: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.before_open = before_open

    def open(self) -> Any:
        if not self.is_connected and self.before_open is not None:
            self.before_open()
        return super().open()


class ProxiedConnection(PreparedConnection):
    """A Fabric connection through ``proxy_argv``, started afresh at every open."""

    def __init__(
        self,
        host: str,
        *,
        proxy_argv: Sequence[str],
        before_open: Callable[[], None] | None = None,
        proxy_env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        # Fabric opens a gateway only when one is set; the string is what it shows, open_gateway
        # below is what it runs (Fabric's own string gateway would expand %h/%p through ssh_config).
        super().__init__(host, before_open=before_open, gateway=shlex.join(proxy_argv), **kwargs)
        self.proxy_argv = list(proxy_argv)
        self.proxy_env = proxy_env
        self.proxy: ProxyProcess | None = None

    def open_gateway(self) -> ProxyProcess:
        self.proxy = ProxyProcess(self.proxy_argv, env=self.proxy_env)
        return self.proxy

    def open(self) -> Any:
        try:
            return super().open()
        except Exception as exc:
            said = self.proxy.stderr_text() if self.proxy is not None else ""
            if self.proxy is not None:
                self.proxy.close()
            if said:
                raise TransportError(
                    f"{self.host}: {shlex.join(self.proxy_argv[:3])} failed: {said.splitlines()[-1]}"
                ) from exc
            raise

    def close(self) -> None:
        super().close()
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
