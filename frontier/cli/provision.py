"""``up`` and ``preview``: Pulumi with the stack checked first and the policy pack always applied.

A plain ``pulumi up`` enforces no policy (a pack runs only when named) and reads the stack file
without Frontier's checks. These tasks load the stack through the one typed loader first, so a bad
value is refused before Pulumi starts, then run Pulumi on that very file with ``--policy-pack``:
a stack that breaks a mandatory rule is never applied.
"""

from __future__ import annotations

import shutil
import subprocess

from invoke import Collection, task
from invoke.exceptions import Exit

from frontier import project
from frontier.cli.common import reports_errors, settings_for
from frontier.config.schema import Settings

STACK = "stack name (default $FRONTIER_STACK, else local)"


def pulumi_command(pulumi: str, settings: Settings, action: str, *, yes: bool = False) -> list[str]:
    """The Pulumi command line for ``action`` (up or preview) on this stack, with the policy pack."""
    command = [
        pulumi, action,
        "--stack", settings.stack,
        "--config-file", settings.source,
        "--policy-pack", str(project.root() / "policy"),
    ]  # fmt: skip
    if yes and action == "up":
        command.append("--yes")
    return command


def _run_pulumi(stack: str | None, action: str, yes: bool = False) -> None:
    settings = settings_for(stack)  # refuses a bad stack before Pulumi is started
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise Exit("error: the pulumi CLI is not on PATH (https://www.pulumi.com/docs/install/)", code=2)
    done = subprocess.run(pulumi_command(pulumi, settings, action, yes=yes), cwd=project.root())
    if done.returncode != 0:
        raise Exit(f"error: pulumi {action} -s {settings.stack} failed (exit {done.returncode})", code=1)


@task(help={"stack": STACK, "yes": "apply without Pulumi's confirmation prompt"})
@reports_errors
def up(c, stack=None, yes=False):
    """Build or change the stack's cloud: `pulumi up` with the policy pack, after the stack's checks."""
    _run_pulumi(stack, "up", yes=yes)


@task(help={"stack": STACK})
@reports_errors
def preview(c, stack=None):
    """What `up` would change, with the policy pack's verdict on every resource."""
    _run_pulumi(stack, "preview")


def register(namespace: Collection) -> None:
    namespace.add_task(up)
    namespace.add_task(preview)
