"""``drivers``: the NVIDIA driver on every GPU host (the AMI's where it ships one, else the pinned branch).

The script is rendered per node group (``templates/install-nvidia.sh.j2``); it checks before it
changes anything, verifies with ``nvidia-smi``, never reboots, and ends with one machine-readable
line that this module reads::

    frontier-drivers: changed=<0|1> reboot_required=<0|1> gpus=<n> driver=<version|none> toolkit=<version>
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.render.boot import render_driver_script

STATUS = re.compile(
    r"^frontier-drivers: changed=(?P<changed>[01]) reboot_required=(?P<reboot>[01]) gpus=(?P<gpus>\d+) "
    r"driver=(?P<driver>\S+) toolkit=(?P<toolkit>\S+)\s*$",
    re.MULTILINE,
)


@dataclass
class DriverResult:
    host: str
    ok: bool
    changed: bool = False
    reboot_required: bool = False
    gpus: int = 0
    driver: str = "none"
    toolkit: str = "none"
    log: str = ""
    error: str = ""


def gpu_hosts(settings: Settings, hosts: list[HostSpec]) -> list[HostSpec]:
    gpu_groups = {g.name for g in settings.node_groups if g.accelerator == "gpu"}
    selected = [h for h in hosts if h.group in gpu_groups]
    if not selected:
        raise FrontierError(
            f"stack {settings.stack!r} has no GPU hosts (node groups with accelerator 'gpu': "
            f"{', '.join(sorted(gpu_groups)) or 'none'})"
        )
    return selected


def run_on_host(settings: Settings, host: HostSpec, conn: Any) -> DriverResult:
    script = render_driver_script(settings, host.group).encode()
    remote = f"/tmp/frontier-install-nvidia-{hashlib.sha256(script).hexdigest()[:12]}.sh"
    sudo = "" if settings.inventory.ssh_user == "root" else "sudo -n "
    try:
        sftp = conn.sftp()
        with sftp.open(remote, "wb") as fh:
            fh.write(script)
        sftp.chmod(remote, 0o700)
        result = conn.run(f"{sudo}bash {shlex.quote(remote)}", hide=True, warn=True, in_stream=False)
    except Exception as exc:  # noqa: BLE001 - an unreachable host is reported with the others
        return DriverResult(host.name, ok=False, error=f"{type(exc).__name__}: {exc}")
    output = (result.stdout + result.stderr).strip()
    matches = list(STATUS.finditer(result.stdout))
    status = matches[-1] if matches else None
    if result.exited != 0 or status is None:
        reason = next(
            (line for line in output.splitlines() if "error:" in line), output.splitlines()[-1:] or [""]
        )
        return DriverResult(
            host.name, ok=False, log=output, error=(reason if isinstance(reason, str) else reason[0])
        )
    return DriverResult(
        host.name,
        ok=True,
        changed=status["changed"] == "1",
        reboot_required=status["reboot"] == "1",
        gpus=int(status["gpus"]),
        driver=status["driver"],
        toolkit=status["toolkit"],
        log=output,
    )


def run(settings: Settings, hosts: list[HostSpec], connect: Callable[[HostSpec], Any]) -> list[DriverResult]:
    """Run the driver script on every GPU host, one after another; every host gets its turn."""
    results = []
    for host in gpu_hosts(settings, hosts):
        conn = connect(host)
        try:
            results.append(run_on_host(settings, host, conn))
        finally:
            conn.close()
    return results
