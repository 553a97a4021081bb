"""``pulumi up -s STACK`` as the CLI's Python language host runs the program, with mocks for the engine.

Run in a fresh interpreter, isolated the way a user's shell cannot help it (``python -I``: no
PYTHONPATH, no user site, no script folder on ``sys.path``)::

    .venv/bin/python -I tests/infra/language_host.py PROGRAM_DIR PROJECT STACK OUT.json

with the stack's config in ``PULUMI_CONFIG`` (``project:key`` names, objects as JSON strings), which
is how the CLI hands it over. What the language host does, this does in the same order:

1. import ``pulumi`` (and nothing of the project),
2. change into the program's folder (``main:`` of ``Pulumi.yaml``),
3. ``runpy.run_path(".", run_name="__main__")``, which puts that folder first on ``sys.path``: a module
   there named like a standard-library or installed module shadows it for every importer.

Only step 0 differs: the engine and AWS are :mod:`cloud_mocks`, loaded by file path so that the tests'
folder never reaches ``sys.path``. OUT.json receives every resource declared (type and name), each
resource's own ``name`` input where it has one (``named``: what AWS shows), each security group's id
each security-group rule's inputs (``rules``: who may reach whom), each log group's and role policy's
inputs (``whole``: retention, key, document) and the stack's exported
outputs; a program that fails prints its traceback and exits non-zero, as ``pulumi up`` would.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.stack import run_pulumi_func

SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
# Recorded with all their inputs (retention and key of a log group; a role policy's document).
RECORDED_WHOLE = ("aws:cloudwatch/logGroup:LogGroup", "aws:iam/rolePolicy:RolePolicy")
SECURITY_GROUP_RULES = (
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
)


def _cloud_mocks() -> Any:
    path = Path(__file__).resolve().with_name("cloud_mocks.py")
    spec = importlib.util.spec_from_file_location("_rehearsal_cloud_mocks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look their module up by name
    spec.loader.exec_module(module)
    return module


def main(program_dir: str, project: str, stack: str, out: str) -> None:
    config = json.loads(os.environ.get("PULUMI_CONFIG", "{}"))
    region = config.get("aws:region", "us-east-1")
    mocks_module = _cloud_mocks()
    created: list[tuple[str, str]] = []
    # Each resource's own name where it gives one (an alarm's, a function's): what AWS shows.
    named: list[tuple[str, str, str]] = []
    groups: dict[str, str] = {}
    rules: list[dict[str, Any]] = []
    whole: list[dict[str, Any]] = []

    class Recording(mocks_module.EksCloudMocks):  # type: ignore[misc, name-defined]
        def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
            created.append((args.typ, args.name))
            if isinstance(args.inputs.get("name"), str):
                named.append((args.typ, args.name, args.inputs["name"]))
            resource_id, outputs = super().new_resource(args)
            if args.typ == SECURITY_GROUP:
                groups[args.name] = resource_id
            if args.typ in SECURITY_GROUP_RULES:
                rules.append({"type": args.typ, "name": args.name, **dict(args.inputs)})
            if args.typ in RECORDED_WHOLE:
                whole.append({"type": args.typ, "resource": args.name, **dict(args.inputs)})
            return resource_id, outputs

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # The gateway's image is told from a runtime host's by the owners the program asks of
    # (cloud_mocks.CloudMocks._ami), here as in the warm interpreter.
    pulumi.runtime.set_mocks(Recording(region), project=project, stack=stack, preview=False)

    os.chdir(program_dir)
    loop.run_until_complete(run_pulumi_func(lambda: runpy.run_path(".", run_name="__main__")))

    root = pulumi.runtime.settings.get_root_resource()
    outputs = {name: _resolve(loop, value) for name, value in dict(root.outputs).items()}
    produced = {
        "resources": created,
        "named": named,
        "groups": groups,
        "rules": rules,
        "whole": whole,
        "outputs": outputs,
    }
    Path(out).write_text(json.dumps(produced, default=str))


def _resolve(loop: asyncio.AbstractEventLoop, value: Any) -> Any:
    if isinstance(value, pulumi.Output):
        return _resolve(loop, loop.run_until_complete(value.future()))
    if isinstance(value, list | tuple):
        return [_resolve(loop, v) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(loop, v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main(*sys.argv[1:])
