"""Print the share of the repository's non-test Python lines that strict mypy checks.

The strict set is ``[tool.mypy] files`` in pyproject.toml (directories expanded to every ``*.py``
under them, globs expanded, ``exclude`` honoured). The whole is every ``*.py`` under the code roots
below, outside tests/ and bench/ (and build output). Lines are physical lines, as ``wc -l`` counts.

    .venv/bin/python scripts/typed_share.py [-v]

``-v`` also lists each root's typed and total lines, and the largest untyped files.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = (
    "frontier",
    "infra",
    "policy",
    "runtime/frontier_runtime",
    "gateway/frontier_gateway",
    "hostside",
)
SKIPPED_DIRS = {"tests", "bench", "build", "__pycache__"}


def python_files(top: Path) -> Iterator[Path]:
    """Every ``*.py`` under ``top`` (or ``top`` itself), outside tests, bench and build output."""
    if top.is_file():
        if top.suffix == ".py":
            yield top
        return
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIPPED_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
        )
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def mypy_files(pyproject: Path) -> set[Path]:
    """The files mypy checks: its ``files`` entries expanded, less what ``exclude`` matches."""
    config = tomllib.loads(pyproject.read_text())["tool"]["mypy"]
    entries = config.get("files", [])
    if isinstance(entries, str):
        entries = [e.strip() for e in entries.split(",") if e.strip()]
    exclude = config.get("exclude")
    patterns = [exclude] if isinstance(exclude, str) else list(exclude or [])
    found: set[Path] = set()
    for entry in entries:
        matches = glob.glob(str(REPO / entry), recursive=True) or [str(REPO / entry)]
        for match in matches:
            found.update(p.resolve() for p in python_files(Path(match)))
    if patterns:
        found = {
            p for p in found if not any(re.search(pat, p.relative_to(REPO).as_posix()) for pat in patterns)
        }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    typed = mypy_files(REPO / "pyproject.toml")
    total_lines = typed_lines = 0
    per_root: dict[str, tuple[int, int]] = {}
    untyped: list[tuple[int, str]] = []
    for root in ROOTS:
        root_total = root_typed = 0
        for path in python_files(REPO / root):
            n = line_count(path)
            root_total += n
            if path.resolve() in typed:
                root_typed += n
            else:
                untyped.append((n, path.relative_to(REPO).as_posix()))
        per_root[root] = (root_typed, root_total)
        total_lines += root_total
        typed_lines += root_typed

    share = 100.0 * typed_lines / total_lines if total_lines else 0.0
    if args.verbose:
        for root, (t, n) in per_root.items():
            print(f"  {root:<28} {t:>6} / {n:>6}  {100.0 * t / n if n else 0.0:5.1f} %")
        print("  largest untyped files:")
        for n, rel in sorted(untyped, reverse=True)[:15]:
            print(f"    {n:>5}  {rel}")
    print(f"strict mypy covers {typed_lines} of {total_lines} non-test lines: {share:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
