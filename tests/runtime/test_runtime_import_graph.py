"""The runtime's modules import one another without a cycle, and so do its rooms.

Built statically from the source: every ``import`` and ``from ... import`` anywhere in a module
(top level, inside functions, under ``TYPE_CHECKING``) is an edge, so a cycle cannot hide behind a
function-level import. A room is a top-level subpackage or module of ``frontier_runtime``
(``engine``, ``structured``, ``server``, ``config``, ...); rooms form layers, so no chain of
imports leads from a room back into itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import frontier_runtime
from import_rooms import find_cycle, room_arrows, room_cycle_report

PACKAGE = "frontier_runtime"
ROOT = Path(frontier_runtime.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The runtime modules that ``name`` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # ``from a import b`` imports the module a.b when there is one, else a name of a.
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                while target not in known:  # ``import a.b.c`` of a name inside a.b
                    target = target.rpartition(".")[0]
                found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def test_the_runtime_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def runtime_room_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Arrows between the runtime's rooms, each with the module arrows that make it."""
    return room_arrows(graph, _room, lambda name, dep: PACKAGE not in (name, dep))


def test_no_import_arrow_runs_back_up_between_rooms() -> None:
    report = room_cycle_report(runtime_room_arrows(import_graph()))
    assert report is None, "rooms import each other in a circle:\n" + (report or "")


def test_a_room_cycle_is_reported_with_its_module_arrows() -> None:
    graph = {
        "frontier_runtime.engine.sampler": {"frontier_runtime.structured.bitmask"},
        "frontier_runtime.structured.bitmask": {"frontier_runtime.engine.api"},
        "frontier_runtime.engine.api": set(),
    }
    assert room_cycle_report(runtime_room_arrows(graph)) == (
        "frontier_runtime.engine -> frontier_runtime.structured -> frontier_runtime.engine\n"
        "  frontier_runtime.engine.sampler -> frontier_runtime.structured.bitmask\n"
        "  frontier_runtime.structured.bitmask -> frontier_runtime.engine.api"
    )
    graph["frontier_runtime.structured.bitmask"] = {"frontier_runtime.requests"}
    assert room_cycle_report(runtime_room_arrows(graph)) is None


def test_the_graph_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    module = tmp_path / "m.py"
    module.write_text(
        "from . import sibling\n"
        "def f():\n"
        "    from frontier_runtime.engine import model_runner\n"
        "    import frontier_runtime.engine.api\n"
    )
    known = {"frontier_runtime.engine", "frontier_runtime.engine.model_runner", "frontier_runtime.engine.api"}
    known |= {"frontier_runtime.engine.sibling"}
    assert _imports("frontier_runtime.engine.m", module, known) == known - {"frontier_runtime.engine"}


def test_models_and_distributed_do_not_import_the_engine() -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name == f"{PACKAGE}.distributed":
            assert not {d for d in deps if d.startswith(PACKAGE)}, deps
        if name.startswith(f"{PACKAGE}.models"):
            assert not {d for d in deps if d.startswith(f"{PACKAGE}.engine")}, (name, deps)
