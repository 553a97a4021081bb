"""A host slot on this machine reached without SSH: the local stack where no sshd exists.

:class:`LocalConnection` answers the few calls a host session makes of a Fabric connection
(``run``, ``sftp``, ``close``) by running commands and touching files here directly.
"""

from __future__ import annotations

import os
from typing import Any

from fabric import Config

from frontier.hosts.inventory import HostSpec


class LocalSFTP:
    """The few SFTP calls a host session makes, on this machine's own filesystem."""

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.mkdir(path, mode)

    def open(self, path: str, mode: str = "r") -> Any:
        return open(path, mode)  # noqa: SIM115 - the caller closes it, as with paramiko

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def posix_rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)


class LocalConnection:
    """A host slot on this machine reached without SSH (the local stack where no sshd exists)."""

    def __init__(self, host: HostSpec) -> None:
        from invoke import Context

        self.host = host.address
        self._context = Context(Config(overrides={"run": {"hide": True, "warn": True}}))

    def run(self, command: str, **kwargs: Any) -> Any:
        return self._context.run(command, **kwargs)

    def sftp(self) -> LocalSFTP:
        return LocalSFTP()

    def close(self) -> None:
        pass
