"""Code that acts for a pool is handed that pool (DESIGN.md, rule 12): nothing outside the loader
reads "the one pool" off a stack's settings.

A read is ``<settings>.model``, ``.runtime``, ``.serving_group`` or ``.only_pool``, a ``.for_pool(...)``
view, or ``.pools[0]``, on a name that holds a stack's settings (``settings``, ``s``, ``view``, ...);
``pool.model`` is a pool's own and is never counted, nor is an entry point's view of the pool its
operator named (``for_pool`` in a task or the demo). The loader and the schema, which build pools,
are not scanned.
"""

from __future__ import annotations

import ast
import re
from collections import Counter

from frontier import project

ROOTS = ("frontier", "infra", "policy")
EXEMPT = {"frontier/config/schema.py", "frontier/config/load.py"}
ONE_POOL = {"model", "runtime", "serving_group", "only_pool"}
SETTINGS_NAME = re.compile(r"(^|_)settings$|^s$|^view$|^multi$")


# Where the pool an entry point acts for is chosen (``frontier.config.load.chosen_pool``: the one
# its --model names, or a one-model stack's only pool): a task or the demo, once, at its top, and
# the targets' factory for a caller that names none (``backend_for(settings)`` on a one-pool stack).
ENTRIES = ("frontier/cli/", "frontier/demo/", "frontier/targets/__init__.py")


def one_pool_reads(tree: ast.AST, *, entry: bool = False) -> int:
    """Reads of the one pool in ``tree``; in an entry point (``entry``) its ``for_pool`` views are
    the pool it chose by name, not counted."""
    count = 0
    read = ONE_POOL if entry else ONE_POOL | {"for_pool"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in read:
            if SETTINGS_NAME.search(_terminal_name(node.value)):
                count += 1
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            index = node.slice
            if node.value.attr == "pools" and isinstance(index, ast.Constant) and index.value == 0:
                count += 1
    return count


def _terminal_name(node: ast.expr) -> str:
    """``self.settings`` -> ``settings``; ``s`` -> ``s``; anything else -> ``""``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def counted() -> Counter[str]:
    root = project.root()
    found: Counter[str] = Counter()
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in EXEMPT:
                continue
            reads = one_pool_reads(ast.parse(path.read_text(), filename=rel), entry=rel.startswith(ENTRIES))
            if reads:
                found[rel] = reads
    return found


def test_no_module_reads_the_one_pool():
    found = dict(counted())
    assert not found, f"hand these modules the pool they act for (reads found): {found}"


def test_only_an_entry_point_chooses_the_pool_it_acts_for():
    root = project.root()
    choosers = sorted(
        rel
        for top in ROOTS
        for path in (root / top).rglob("*.py")
        if (rel := path.relative_to(root).as_posix()) not in EXEMPT
        and not rel.startswith(ENTRIES)
        and _calls(ast.parse(path.read_text(), filename=rel), "chosen_pool")
    )
    assert not choosers, f"hand these modules the pool their entry point chose: {choosers}"


def _calls(tree: ast.AST, name: str) -> bool:
    return any(isinstance(node, ast.Call) and _terminal_name(node.func) == name for node in ast.walk(tree))


def test_a_pools_own_model_is_not_a_one_pool_read():
    assert one_pool_reads(ast.parse("pool.model.name; pool.runtime.port; p.group")) == 0


def test_an_entry_points_view_of_the_pool_it_named_is_not_counted():
    named = ast.parse("backend_for(settings.for_pool(model))")
    assert one_pool_reads(named, entry=True) == 0
    assert one_pool_reads(named) == 1


def test_a_settings_read_of_the_model_is_counted():
    assert one_pool_reads(ast.parse("self.settings.model.name; s.runtime.port; settings.pools[0]")) == 3
