"""Code that acts for a pool is handed that pool (DESIGN.md, rule 12): what still reads "the one
pool" off a stack's settings is counted here, file by file, and may only shrink.

A read is ``<settings>.model``, ``.runtime``, ``.serving_group`` or ``.only_pool``, a ``.for_pool(...)``
view, or ``.pools[0]``, on a name that holds a stack's settings (``settings``, ``s``, ``view``, ...);
``pool.model`` is a pool's own and is never counted. The loader and the schema, which build pools,
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

# Reads left where a module still acts for a one-pool view (Settings.for_pool) rather than a pool
# it is handed. Lower a count when a module is moved to take its pool; never raise one.
LEFT = {
    "frontier/cli/common.py": 1,
    "frontier/cli/keys.py": 1,
    "frontier/config/checks.py": 1,
    "frontier/demo/run.py": 1,
    "frontier/demo/zero.py": 2,
    "frontier/hosts/session.py": 1,
    "frontier/release/history.py": 1,
    "frontier/render/release.py": 1,
    "frontier/rollout/canary.py": 2,
    "frontier/rollout/deploy.py": 2,
    "frontier/rollout/rolling.py": 1,
    "frontier/targets/ec2/backend.py": 3,
    "frontier/targets/kubernetes/autoscaling.py": 4,
    "frontier/targets/kubernetes/backend.py": 2,
    "frontier/targets/kubernetes/gateway.py": 3,
    "frontier/targets/kubernetes/leader_workers.py": 4,
    "frontier/targets/kubernetes/manifests.py": 4,
    "frontier/targets/kubernetes/network_policies.py": 1,
    "frontier/targets/kubernetes/objects.py": 1,
    "frontier/targets/kubernetes/rollout.py": 1,
    "frontier/targets/local/autoscaler.py": 4,
    "frontier/targets/local/backend.py": 1,
    "frontier/targets/local/balancer.py": 6,
    "frontier/targets/local/cluster.py": 3,
    "frontier/targets/local/group.py": 4,
    "frontier/targets/local/heal.py": 1,
    "frontier/targets/local/iam.py": 1,
}


# Where the pool an entry point acts for is chosen (``frontier.config.load.chosen_pool``: the one
# its --model names, or a one-model stack's only pool): a task or the demo, once, at its top.
ENTRIES = ("frontier/cli/", "frontier/demo/")


def one_pool_reads(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ONE_POOL | {"for_pool"}:
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
            reads = one_pool_reads(ast.parse(path.read_text(), filename=rel))
            if reads:
                found[rel] = reads
    return found


def test_no_module_reads_more_of_the_one_pool_than_it_did():
    grown = {path: (n, LEFT.get(path, 0)) for path, n in counted().items() if n > LEFT.get(path, 0)}
    assert not grown, f"hand these modules the pool they act for (reads found, allowed): {grown}"


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


def test_a_settings_read_of_the_model_is_counted():
    assert one_pool_reads(ast.parse("self.settings.model.name; s.runtime.port; settings.pools[0]")) == 3
