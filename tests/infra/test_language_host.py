"""Every stack's program runs the way ``pulumi up`` runs it: a fresh interpreter in the program's folder.

The other infra tests import the program into this warm interpreter, where the repository root is on
``sys.path`` and every library is already imported; the CLI's language host does neither. These run
``language_host.py`` as a child process per stack (see its docstring for the sequence it copies) and
read back what it declared. A module of the program's folder that shadows a library, an import that
only works from the repository root, or config the program cannot read fails here as it would for a
user, before a single resource exists.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_mocks import CLOUD_STACKS, graph_for

from frontier.config.outputs import Ec2Outputs, KubernetesOutputs
from frontier.project import STACKS_DIR_ENV
from frontier.targets import load_stack

REPO = Path(__file__).resolve().parents[2]
HOST = Path(__file__).with_name("language_host.py")
PROJECT = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
PROGRAM_DIR = REPO / PROJECT["main"]
STACKS = sorted(
    p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (REPO / "stacks").glob("Pulumi.*.yaml")
)
OUR_PACKAGES = ("frontier", "infra", "policy", "frontier_runtime", "frontier_gateway", "frontier_settings")

pytestmark = pytest.mark.slow


def pulumi_config(stack: str) -> dict[str, str]:
    """``PULUMI_CONFIG`` of a shipped stack as the CLI sets it."""
    return cli_config(yaml.safe_load((REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"])


def cli_config(config: Mapping[str, Any]) -> dict[str, str]:
    """A stack file's ``config:`` as the CLI passes it: ``project:key`` names, non-string values as JSON."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in config.items()}


def launch(
    stack: str, config: Mapping[str, Any], out: Path, stacks: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``language_host.py`` run for ``stack`` as the CLI starts it: a fresh ``python -I``, none of this
    interpreter's Pulumi, Python or Frontier environment, ``config`` (the stack file's ``config:``)
    in ``PULUMI_CONFIG``; ``stacks``: the stacks directory of a variant (``$FRONTIER_STACKS_DIR``,
    where the program's loader reads its file). What it declared is written to ``out``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "PYTHON", "FRONTIER_"))}
    env["PULUMI_CONFIG"] = json.dumps(cli_config(config))
    if stacks is not None:
        env[STACKS_DIR_ENV] = str(stacks)
    return subprocess.run(
        [sys.executable, "-I", str(HOST), str(PROGRAM_DIR), PROJECT["name"], stack, str(out)],
        cwd="/",  # the CLI's own cwd does not matter: the host changes into the program's folder
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@dataclass(frozen=True)
class Run:
    returncode: int
    stderr: str
    resources: list[tuple[str, str]]
    outputs: dict[str, Any]


def run_as_language_host(stack: str, tmp: Path) -> Run:
    out = tmp / f"{stack}.json"
    proc = launch(stack, pulumi_config(stack), out)
    produced = json.loads(out.read_text()) if out.exists() else {"resources": [], "outputs": {}}
    return Run(proc.returncode, proc.stderr, [tuple(r) for r in produced["resources"]], produced["outputs"])


def declared(stack: str, document: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """What the language host declares for ``document`` as the stack file ``Pulumi.<stack>.yaml``
    (a variant of a shipped stack, in a stacks directory of its own): the host's whole record."""
    stacks = tmp / "stacks"
    stacks.mkdir()
    (stacks / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    out = tmp / "declared.json"
    done = launch(stack, document["config"], out, stacks)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@cache
def runs() -> dict[str, Run]:
    """All stacks at once, two at a time (the machine's cores): each child pays its own imports."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"frontier-language-host-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(STACKS, pool.map(lambda s: run_as_language_host(s, tmp), STACKS), strict=True))


@pytest.mark.parametrize("stack", [s for s in STACKS if s != "local"])
def test_every_cloud_stack_builds_its_graph_as_pulumi_up_runs_it(stack: str) -> None:
    run = runs()[stack]
    assert run.returncode == 0, f"pulumi up -s {stack} fails in the language host:\n{run.stderr[-4000:]}"
    contract = KubernetesOutputs if load_stack(stack).target == "kubernetes" else Ec2Outputs
    contract[str].model_validate(run.outputs)  # every output `fab` reads was exported
    assert len(run.resources) > 50, f"{stack}: only {len(run.resources)} resources declared"


@pytest.mark.parametrize("stack", [s for s in CLOUD_STACKS if s in STACKS])
def test_the_language_host_declares_what_the_warm_interpreter_declares(stack: str) -> None:
    warm = {(r.type, r.name) for r in graph_for(stack).resources}
    assert set(runs()[stack].resources) == warm


def test_the_local_stack_is_refused_by_the_program_with_its_reason() -> None:
    run = runs()["local"]
    assert run.returncode != 0
    assert "never provisioned by Pulumi" in run.stderr


def _installed_top_level_names() -> set[str]:
    ours = set(OUR_PACKAGES)
    return {
        name
        for name, dists in importlib.metadata.packages_distributions().items()
        if name not in ours and not name.startswith("_")
    }


def _module_names(folder: Path) -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in folder.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__" and p.stem != "__main__")
        or (p.is_dir() and (p / "__init__.py").exists())
    }


@pytest.mark.parametrize(
    ("where", "folder"),
    [("the program's folder", PROGRAM_DIR), ("the repository root", REPO)],
)
def test_no_module_shadows_a_standard_or_installed_module(where: str, folder: Path) -> None:
    """``run_path`` puts the program's folder first on ``sys.path``, and editable installs the root."""
    taken = set(sys.stdlib_module_names) | _installed_top_level_names()
    shadowing = sorted(_module_names(folder) & taken)
    assert not shadowing, f"modules in {where} ({folder}) shadow libraries of the same name: {shadowing}"


def test_the_shadowing_check_sees_a_stdlib_name(tmp_path: Path) -> None:
    """The rule above catches what broke every stack once: a ``secrets.py`` beside ``__main__.py``."""
    (tmp_path / "secrets.py").write_text("")
    assert _module_names(tmp_path) & set(sys.stdlib_module_names) == {"secrets"}
