"""A private copy of the local stack for tests: its own state dir, loopback aliases and free ports.

The copy lives in a temporary stacks folder (``$FRONTIER_STACKS_DIR``), so every task and library
call that loads the ``local`` stack sees it, and nothing of the real ``stacks/`` or ``.frontier/``
is touched. Host slots sit on 127.0.2.2-127.0.2.4, apart from other suites' addresses.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import yaml

from frontier import project

ADDRESSES = ("127.0.2.2", "127.0.2.3", "127.0.2.4")


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def free_port_on_all(addresses: tuple[str, ...], *, besides: frozenset[int] | set[int] = frozenset()) -> int:
    """A port free on every address (so each host slot can listen on the same number).

    ``besides`` holds ports already handed out for the same stack: the kernel may hand a
    just-released ephemeral port out again, and two services of one stack cannot share it.
    """
    for _ in range(50):
        port = free_port(addresses[0])
        if port in besides:
            continue
        try:
            for address in addresses[1:]:
                with socket.socket() as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {addresses}")


def write_local_stack(root: Path, *, hosts: int = 3, edit: dict | None = None) -> Path:
    """Write ``root/stacks/Pulumi.local.yaml``; return the stacks folder. ``edit`` overrides sections."""
    document = yaml.safe_load(((project.root() / "stacks") / "Pulumi.local.yaml").read_text())
    config = document["config"]
    state = root / "state"
    taken: set[int] = set()

    def distinct(port_on: Callable[[], int]) -> int:
        while (port := port_on()) in taken:
            pass
        taken.add(port)
        return port

    ssh_port = distinct(lambda: free_port_on_all(ADDRESSES[:hosts], besides=taken))
    runtime_port = distinct(lambda: free_port_on_all(ADDRESSES[:hosts], besides=taken))
    config["frontier:local"] = {
        "state_dir": str(state),
        "moto_port": distinct(free_port),
        "balancer_port": distinct(free_port),
        "balancer_stats_port": distinct(free_port),
    }
    config["frontier:inventory"]["ssh_key_file"] = str(state / "ssh" / "id_ed25519")
    config["frontier:inventory"]["hosts"] = [
        {
            "name": f"host-{i + 1}",
            "address": ADDRESSES[i],
            "ssh_port": ssh_port,
            "root": str(state / "hosts" / f"host-{i + 1}"),
        }
        for i in range(hosts)
    ]
    config["frontier:runtime"]["port"] = runtime_port
    for group in config["frontier:node_groups"]:
        group["min_size"] = group["desired_size"] = group["max_size"] = hosts
    for section, values in (edit or {}).items():
        config[f"frontier:{section}"] = {**config[f"frontier:{section}"], **values}
    stacks = root / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    (stacks / "Pulumi.local.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return stacks
