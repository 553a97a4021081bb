"""The host side runs under a host's own python3: standard library only, and what it imports travels.

Read from the source (every ``import`` and ``from ... import``, also those inside functions), so an
import that only runs on one path still counts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import frontier_hostside
import pytest
from frontier_hostside.names import BOOTSTRAP_FILE_NAME

PACKAGE = frontier_hostside.PACKAGE
SOURCES = sorted(frontier_hostside.PACKAGE_DIR.rglob("*.py"))
MODULES = {PACKAGE} | {f"{PACKAGE}.{p.stem}" for p in SOURCES if p.name != "__init__.py"}


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports: ``from pkg import mod`` counts as pkg.mod where that is one of ours."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            # A relative import stays inside the package.
            origin = PACKAGE if node.level else node.module or ""
            for alias in node.names:
                found.add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin)
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_the_host_side_imports_only_the_standard_library_and_itself(path: Path):
    allowed = set(sys.stdlib_module_names) | {"__future__", PACKAGE}
    outside = sorted(m for m in _imports(path) if m.split(".")[0] not in allowed)
    assert not outside, outside


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_the_host_side_is_written_in_the_python_of_the_oldest_hosts(path: Path):
    # Python 3.8's grammar only: a newer library call (str.removeprefix is 3.9) passes this unseen.
    ast.parse(path.read_text(), str(path), feature_version=(3, 8))


def test_the_host_tools_import_only_the_package_files_that_travel_with_them():
    # A host gets the agent and the bootstrap as scripts and, of this package, only these files.
    travelling = {PACKAGE} | {f"{PACKAGE}.{Path(n).stem}" for n in frontier_hostside.IMPORTED_FILES}
    for name in ("agent.py", "bootstrap.py", *frontier_hostside.IMPORTED_FILES):
        ours = {m for m in _imports(frontier_hostside.PACKAGE_DIR / name) if m.split(".")[0] == PACKAGE}
        assert ours <= travelling, (name, sorted(ours - travelling))


def test_the_import_reader_sees_function_level_relative_and_submodule_imports(tmp_path: Path):
    module = tmp_path / "m.py"
    lines = [
        "def f():",
        "    import yaml",
        "    from . import agent",
        f"    from {PACKAGE} import names, host_tools",
    ]
    module.write_text("\n".join(lines) + "\n")
    assert _imports(module) == {"yaml", f"{PACKAGE}.agent", f"{PACKAGE}.names", PACKAGE}


def test_the_bootstrap_runs_from_the_files_that_travel_with_it_alone(tmp_path: Path):
    """What cloud-init fetches into <root>/bin, run without site-packages or PYTHONPATH (``-S -E``),
    as a host's python3 that has none of our packages would."""
    bin_dir = tmp_path / "bin"
    for name, data in frontier_hostside.host_tools().items():
        (bin_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (bin_dir / name).write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-S", "-E", str(bin_dir / BOOTSTRAP_FILE_NAME), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "frontier-bootstrap" in done.stdout
