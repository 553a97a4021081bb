"""Where a Frontier project lives on disk: its stacks, templates, runtime sources and local state.

One root, found once: ``$FRONTIER_PROJECT_ROOT`` when set, else the nearest folder at or above the
working directory that holds ``Pulumi.yaml`` and ``stacks/``, else the checkout this package was
installed from (an editable install). Every other module asks here instead of computing paths
from its own ``__file__``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from frontier.errors import FrontierError

PROJECT_ROOT_ENV = "FRONTIER_PROJECT_ROOT"
STACKS_DIR_ENV = "FRONTIER_STACKS_DIR"
RUNTIME_DIR_ENV = "FRONTIER_RUNTIME_DIR"


def _is_project(folder: Path) -> bool:
    return (folder / "Pulumi.yaml").is_file() and (folder / "stacks").is_dir()


@functools.cache
def _discovered_root(cwd: Path) -> Path:
    for folder in (cwd, *cwd.parents):
        if _is_project(folder):
            return folder
    checkout = Path(__file__).resolve().parent.parent
    if _is_project(checkout):
        return checkout
    raise FrontierError(
        f"no Frontier project at or above {cwd} (a folder with Pulumi.yaml and stacks/); "
        f"run from the project or set ${PROJECT_ROOT_ENV}"
    )


def root() -> Path:
    override = os.environ.get(PROJECT_ROOT_ENV)
    if override:
        return Path(override).resolve()
    return _discovered_root(Path.cwd().resolve())


def stacks_dir() -> Path:
    """``$FRONTIER_STACKS_DIR`` when set (a copy of the stacks to try a change), else ``stacks/``."""
    override = os.environ.get(STACKS_DIR_ENV)
    return Path(override) if override else root() / "stacks"


def templates_dir() -> Path:
    return root() / "templates"


def runtime_dir() -> Path:
    """The runtime's sources, built into the wheel that a release ships where no container runs.

    ``$FRONTIER_RUNTIME_DIR`` builds from another checkout of the runtime (a branch under test).
    """
    override = os.environ.get(RUNTIME_DIR_ENV)
    return Path(override) if override else root() / "runtime"


def hostside_dir() -> Path:
    """The host side's distribution (``frontier-hostside``): the runtime image installs it beside the
    runtime."""
    return root() / "hostside"


def state_dir() -> Path:
    """Operator-side state: artifact cache, saved stack outputs, load-test results."""
    return root() / ".frontier"


def resolve(path: str | Path) -> Path:
    """``~`` expanded; a relative path taken from the project root."""
    expanded = Path(os.path.expanduser(str(path)))
    return expanded if expanded.is_absolute() else root() / expanded
