"""The host's processes as the agent and its keepers handle them, and the records they keep of them.

Is a pid alive, stop one (SIGTERM, drain, SIGKILL), read its command line; the moment a record is
stamped with; a file replaced whole, so a reader never sees half of it. Standard library only,
Python 3.8 and later: it travels beside ``frontier-agent.py`` (``frontier_hostside.IMPORTED_FILES``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie. (Reaping is its parent's business: pass the Popen.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # The state is the first field after the command name, which is in parentheses.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def wait_exit(pid: int, timeout: float, process: subprocess.Popen[Any] | None = None) -> bool:
    """True once ``pid`` has exited (within ``timeout`` seconds)."""
    if process is not None:
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def terminate_then_kill(
    pid: int,
    timeout: float,
    *,
    kill_timeout: float = 5.0,
    still_ours: Callable[[], bool] | None = None,
    process: subprocess.Popen[Any] | None = None,
) -> str:
    """Stop one process: SIGTERM, wait ``timeout`` s, SIGKILL, wait ``kill_timeout`` s.

    Returns ``"absent"`` (it was already gone, a zombie, or the pid now belongs to another
    program), ``"terminated"`` (it exited on SIGTERM), ``"killed"`` (it needed SIGKILL) or
    ``"stuck"`` (it outlived SIGKILL too, e.g. in uninterruptible sleep). ``still_ours`` is asked
    before each signal, so a pid recycled meanwhile is never signalled; ``process``, when the
    caller started it, is waited on so that it is reaped.
    """

    def ours() -> bool:
        alive = process.poll() is None if process is not None else pid_alive(pid)
        return alive and (still_ours is None or still_ours())

    if not ours():
        return "absent"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_exit(pid, timeout, process):
        return "terminated"
    if not ours():
        return "terminated"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return "killed" if wait_exit(pid, kill_timeout, process) else "stuck"


def command_line(pid: int, settle_s: float = 0.5) -> str:
    """The process's command line. A process reads as '' for a moment while it is being started
    (seen here just after a supervisor launched the runtime): wait that moment out."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""
        if text or time.monotonic() >= deadline:
            return text
        time.sleep(0.01)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
