"""The toolkit's modules import each other without circles, and rooms keep their direction.

The graph is read from the source (every ``import`` and ``from ... import``, also those inside
functions), so a circle dodged with a late import still counts. A room is a top-level subpackage
or module of ``frontier``, and each target's package under ``frontier/targets/`` is a room of its
own; rooms form layers, so no chain of imports leads from a room back into itself. Only the
factory (``frontier/targets/__init__.py``) looks at a stack's target (the AST check at the end).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from import_rooms import find_cycle, room_arrows, room_cycle_report

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


def test_the_toolkit_has_no_import_circle():
    cycle = find_cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def _room(module: str) -> str:
    """``frontier.config.schema`` lives in ``frontier.config``; ``frontier.aws`` is a room itself; a
    target's package (``frontier.targets.local``) is a room apart from the factory's
    (``frontier.targets``, with ``frontier.targets.base``)."""
    parts = module.split(".")
    if (
        parts[:2] == ["frontier", "targets"]
        and len(parts) > 2
        and (ROOT / "frontier/targets" / parts[2]).is_dir()
    ):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def test_each_target_is_a_room_apart_from_the_factory():
    assert _room("frontier.targets.local.group") == "frontier.targets.local"
    assert _room("frontier.targets.kubernetes") == "frontier.targets.kubernetes"
    assert _room("frontier.targets.base") == _room("frontier.targets") == "frontier.targets"
    assert _room("frontier.config.schema") == "frontier.config"


def _room_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Arrows between rooms of ``frontier``, each with the module arrows that make it."""
    return room_arrows(
        graph, _room, lambda name, dep: name.startswith("frontier.") and dep.startswith("frontier.")
    )


def test_a_room_cycle_is_reported_with_its_module_arrows():
    arrows = {
        ("frontier.a", "frontier.b"): ["frontier.a.x -> frontier.b.y"],
        ("frontier.b", "frontier.a"): ["frontier.b.y -> frontier.a.z"],
        ("frontier.b", "frontier.c"): ["frontier.b.y -> frontier.c"],
    }
    assert room_cycle_report(arrows) == (
        "frontier.a -> frontier.b -> frontier.a\n  frontier.a.x -> frontier.b.y\n  frontier.b.y -> frontier.a.z"
    )
    del arrows[("frontier.b", "frontier.a")]
    assert room_cycle_report(arrows) is None


def test_no_import_arrow_runs_back_up_between_rooms():
    report = room_cycle_report(_room_arrows(_graph()))
    assert report is None, "rooms import each other in a circle:\n" + (report or "")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function, by its full dotted name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_toolkit_never_imports_the_pulumi_program_or_pulumi():
    """``infra/`` builds on ``frontier/`` (the settings, the rendered files, the IAM documents of
    ``frontier/identity/``), never the other way: the toolkit runs where Pulumi is not installed."""
    offenders = sorted(
        f"{_module_name(path)} -> {module}"
        for path in (ROOT / "frontier").rglob("*.py")
        for module in _imports(path)
        if module.split(".")[0] in ("infra", "pulumi", "pulumi_aws", "pulumi_kubernetes")
    )
    assert not offenders, "the toolkit imports the Pulumi program or Pulumi:\n" + "\n".join(offenders)


def test_an_import_of_the_program_inside_a_function_is_found(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def documents():\n    from infra.identity import Identity\n    import pulumi_aws\n")
    assert _imports(module) == {"infra.identity", "pulumi_aws"}


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("frontier.render.", "frontier.hosts."),  # render writes host files; hosts/ puts them on hosts
        ("frontier.config.", "frontier.hosts."),  # settings know nothing of hosts
        ("frontier.config.", "frontier.rollout."),
        ("frontier.config.", "frontier.capacity."),  # settings know nothing of capacity planning
        ("frontier.release.", "frontier.render."),  # a release holds rendered files, never renders
        ("frontier.hosts.", "frontier.rollout."),  # hosts know nothing of rollouts
        ("frontier.release.", "frontier.rollout."),
        # The targets sit above what they are made of: a rollout, a release, rendered files, settings.
        ("frontier.hosts.", "frontier.targets"),
        ("frontier.rollout.", "frontier.targets"),
        ("frontier.release.", "frontier.targets"),
        ("frontier.render.", "frontier.targets"),
        ("frontier.config.", "frontier.targets"),
        ("frontier.capacity.", "frontier.targets"),
        ("frontier.identity.", "frontier.targets"),  # the IAM documents serve every target alike
        # A target knows no other target and not the factory that chooses between them.
        ("frontier.targets.local.", "frontier.targets"),
        ("frontier.targets.ec2.", "frontier.targets"),
        ("frontier.targets.kubernetes.", "frontier.targets"),
        ("frontier.targets", "frontier.demo"),  # the demo drives the targets, not the other way
        ("frontier.", "frontier.cli"),  # the library never imports its Fabric tasks
    ],
)
@pytest.mark.slow
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


# --- only the factory knows the target ------------------------------------------------------------

FACTORY = "frontier/targets/__init__.py"
TARGETS = {"local", "ec2", "kubernetes"}
# A target's own settings section: testing whether it is there asks which target this is. The
# target's own code may (it narrows the type; it never chooses between targets).
SECTION_OWNERS = {
    "local": ("frontier/targets/local/",),
    "kubernetes": ("frontier/targets/kubernetes/",),
}

# Branches on the target that still stand, as (file, function), each with what removes it. An
# entry that no longer branches fails `test_every_allowed_target_branch_still_exists`.
ALLOWED_TARGET_BRANCHES: set[tuple[str, str]] = set()


def _string_constants(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {value for element in node.elts for value in _string_constants(element)}
    return set()


def _section(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The target section ``node`` reads: ``settings.local``, or a name bound to it."""
    if isinstance(node, ast.Attribute) and node.attr in SECTION_OWNERS:
        return node.attr
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    return None


def _truth_tested(test: ast.expr) -> list[ast.expr]:
    """The operands whose truth an ``if``/``while``/``... if ... else`` test takes."""
    if isinstance(test, ast.BoolOp):
        return [part for value in test.values for part in _truth_tested(value)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _truth_tested(test.operand)
    return [test]


def _target_branches(tree: ast.AST, path: str) -> list[tuple[int, str]]:
    """Where the module branches on the target: (line, code) for each place."""
    aliases = {
        target.id: section
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and (section := _section(node.value, {}))
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def foreign_section(node: ast.expr) -> bool:
        section = _section(node, aliases)
        return section is not None and not path.startswith(SECTION_OWNERS[section])

    hits: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            attributes = {o.attr for o in operands if isinstance(o, ast.Attribute)}
            names = {value for o in operands for value in _string_constants(o)}
            is_none = any(isinstance(o, ast.Constant) and o.value is None for o in operands)
            if (
                "target" in attributes
                or ("kind" in attributes and names & TARGETS)
                or (is_none and any(foreign_section(o) for o in operands))
            ):
                hits.append(node)
        elif (
            isinstance(node, ast.Match)
            and isinstance(node.subject, ast.Attribute)
            and node.subject.attr in ("target", "kind")
        ) or (
            isinstance(node, ast.If | ast.IfExp | ast.While)
            and any(foreign_section(part) for part in _truth_tested(node.test))
        ):
            hits.append(node)
    return [(node.lineno, ast.unparse(node).splitlines()[0]) for node in hits]


def _functions_of(tree: ast.AST) -> dict[int, str]:
    """Each line's innermost enclosing function (its name), for the allow-list."""
    where: dict[int, str] = {}
    # ast.walk goes breadth first, so a nested function comes after (and overrides) its outer one.
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                where[line] = node.name
    return where


def _offenders() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for file in sorted((ROOT / "frontier").rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        if path == FACTORY:
            continue
        tree = ast.parse(file.read_text())
        functions = _functions_of(tree)
        for line, code in _target_branches(tree, path):
            found[(path, functions.get(line, "<module>"))].append(f"{path}:{line}: {code}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "if settings.target == 'ec2': pass",
        "match s.target:\n    case 'local': pass",
        "ok = backend_for(settings).kind != 'local'",
        "ok = backend.kind in ('ec2', 'kubernetes')",
        "ok = settings.local is None",
        "ok = s.kubernetes is not None",
        "x = settings.local.port if settings.local else 80",
        "if not settings.local: pass",
        "local = settings.local\nx = 1 if local else 2",
    ],
)
def test_a_branch_on_the_target_is_found_directly_or_by_proxy(source):
    assert _target_branches(ast.parse(source), "frontier/render/stack.py")


@pytest.mark.parametrize(
    "source",
    [
        "ok = release.artifact.kind == 'wheel'",  # an artifact's kind, not a target
        "print(settings.target)",  # naming the target is not branching on it
        "port = settings.local.moto_port",
    ],
)
def test_reading_without_branching_on_the_target_is_no_branch(source):
    assert _target_branches(ast.parse(source), "frontier/render/stack.py") == []


def test_a_target_tests_for_its_own_section_in_its_own_code():
    assert (
        _target_branches(ast.parse("ok = settings.local is None"), "frontier/targets/local/cluster.py") == []
    )
    assert _target_branches(
        ast.parse("ok = settings.local is None"), "frontier/targets/kubernetes/objects.py"
    )


def test_only_the_backend_factory_branches_on_the_target():
    found = _offenders()
    offenders = [hit for place, hits in found.items() if place not in ALLOWED_TARGET_BRANCHES for hit in hits]
    assert not offenders, f"branch on the target outside {FACTORY}:\n" + "\n".join(offenders)


def test_every_allowed_target_branch_still_exists():
    gone = sorted(ALLOWED_TARGET_BRANCHES - set(_offenders()))
    assert not gone, f"no longer branches on the target, so drop from ALLOWED_TARGET_BRANCHES: {gone}"
