"""The toolkit's modules import each other without circles, and rooms keep their direction.

The graph is read from the source (every ``import`` and ``from ... import``, also those inside
functions), so a circle dodged with a late import still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("frontier", "infra", "policy")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {
        _module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__main__" not in p.name
    }
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import module` depends on that module; `from module import name` on
                # the module. (Every import also runs parent packages' __init__, which are thin.)
                submodules = [
                    f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules
                ]
                targets = submodules or [node.module]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_toolkit_has_no_import_circle():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("frontier.contracts", "frontier."),  # contracts depends on nothing of ours
        ("frontier.config.", "frontier.fleet."),  # settings know nothing of hosts
        ("frontier.config.", "frontier.rollout."),
        ("frontier.fleet.", "frontier.rollout."),  # hosts know nothing of rollouts
        ("frontier.release.", "frontier.rollout."),
        ("frontier.", "frontier.cli"),  # the library never imports its Fabric tasks
    ],
)
def test_lower_rooms_never_import_upper_ones(lower, upper):
    graph = _graph()
    offenders = [
        f"{name} -> {dep}"
        for name, deps in graph.items()
        if (name == lower or name.startswith(lower)) and not name.startswith("frontier.cli")
        for dep in deps
        if dep.startswith(upper) and dep != name and not dep.startswith(lower)
    ]
    assert not offenders, offenders


def test_is_local_style_target_checks_live_only_in_the_backend_factory():
    hits = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "frontier").rglob("*.py")
        if "settings.target" in p.read_text()
        and p.relative_to(ROOT).as_posix() != "frontier/backends/__init__.py"
    ]
    assert hits == [], hits
