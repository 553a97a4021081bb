"""Import graphs read from source, for the layering tests of the toolkit and of the runtime.

A module's imports are edges; grouping modules into rooms gives the arrows between rooms, each
with the module imports that make it. A cycle among rooms is an arrow that runs back up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def room_arrows(
    graph: dict[str, set[str]], room: Callable[[str], str], counts: Callable[[str, str], bool]
) -> dict[tuple[str, str], list[str]]:
    """Arrows between rooms (``room`` names a module's), each with the module arrows that make it;
    only module arrows for which ``counts`` holds are looked at."""
    arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if counts(name, dep) and room(name) != room(dep):
                arrows[(room(name), room(dep))].append(f"{name} -> {dep}")
    return arrows


def room_cycle_report(arrows: dict[tuple[str, str], list[str]]) -> str | None:
    """A cycle of rooms and the module arrows along it, or None."""
    rooms: dict[str, set[str]] = defaultdict(set)
    for upper, lower in arrows:
        rooms[upper].add(lower)
    cycle = find_cycle(rooms)
    if cycle is None:
        return None
    lines = [" -> ".join(cycle)]
    for upper, lower in zip(cycle, cycle[1:], strict=False):
        lines += [f"  {edge}" for edge in arrows[(upper, lower)]]
    return "\n".join(lines)
