"""Frontier's host side: what runs on a host under its own ``python3``, and the names all rooms share.

Standard library only, Python 3.8 and later (tests/unit/test_hostside.py checks the imports)::

    names      paths, file names, tags, metric names, priority classes and id patterns that the
               toolkit, the runtime, the gateway and the host tools all import
    agent      the host agent: one host's releases and runtime (a host runs it as frontier-agent.py)
    keeper     what the agent's two keepers of a running runtime share: probing, counting, history
    supervisor the keeper where no systemd runs: the runtime's parent, restarting it
    watchdog   the keeper where systemd runs: restarting the runtime's unit when liveness fails
    processes  pids, signals and whole-file records, for the agent and its keepers
    interruption   spot notices from IMDS: the agent's ``interruptions`` command drains the host
    weights_cache  the cached weights versions no release names any more (the agent's prune)
    bootstrap  what a host does by itself: boot, publish, drain (a host runs it as frontier-bootstrap.py)
    node_boot  the bootstrap's commands on a runtime host: boot, abandon, publish, watch, replica-env
    gateway_boot  the bootstrap's command on a gateway host: publish-gateway
    aws_cli    AWS through its CLI, as the bootstrap reaches it
    rendezvous a replica's slots over several nodes (the bootstrap's replica-env)
    release_signature  a release's signature checked with the stack's public key (the agent's stage, activate)
    probe      the synthetic probe: a fixed request through the public endpoint (a Lambda on EC2, a
               CronJob in the runtime's image on Kubernetes, the local stack's alarm evaluator)

A host runs the agent and the bootstrap as scripts from ``<root>/bin``. They import their names
and the modules above from this package, so those travel with them, as ``bin/frontier_hostside/``:
a script's own folder comes first on ``sys.path``, so the copy beside it is the one it imports.
"""

from __future__ import annotations

from pathlib import Path

from frontier_hostside.names import AGENT_FILE_NAME, BOOTSTRAP_FILE_NAME

PACKAGE = "frontier_hostside"
PACKAGE_DIR = Path(__file__).resolve().parent
# What the scripts import from this package; nothing else of it goes to a host.
IMPORTED_FILES = (
    "__init__.py",
    "names.py",
    "processes.py",
    "keeper.py",
    "supervisor.py",
    "watchdog.py",
    "interruption.py",
    "weights_cache.py",
    "aws_cli.py",
    "node_boot.py",
    "gateway_boot.py",
    "rendezvous.py",
    "release_signature.py",
)


def package_files() -> dict[str, bytes]:
    """This package as the scripts import it: path under ``<root>/bin`` -> bytes.

    On a host this reads the copy the running script imported, so the agent hands on what it got.
    """
    return {f"{PACKAGE}/{name}": (PACKAGE_DIR / name).read_bytes() for name in IMPORTED_FILES}


def agent_files() -> dict[str, bytes]:
    """The host agent as hosts run it (``frontier-agent.py``) and the files it imports."""
    return {AGENT_FILE_NAME: (PACKAGE_DIR / "agent.py").read_bytes(), **package_files()}


def host_tools() -> dict[str, bytes]:
    """Everything of this package a cloud host fetches at boot: the agent, the bootstrap, their names."""
    return {**agent_files(), BOOTSTRAP_FILE_NAME: (PACKAGE_DIR / "bootstrap.py").read_bytes()}
