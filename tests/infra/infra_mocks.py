"""Run the Pulumi program under mocks and keep what it created as plain data.

No Pulumi CLI or engine exists here, so ``pulumi.runtime.set_mocks`` stands in for the engine and
:class:`cloud_mocks.CloudMocks` for AWS: it answers every invoke the program makes (and fails loudly on any
other), and returns for each resource its inputs plus the computed outputs AWS would add (ARNs,
ids, DNS names, ...). Each program run happens in a fresh :class:`contextvars.Context`, because
Pulumi keeps its settings and root stack in context variables: runs for dev, staging and prod share
one interpreter and one import of the program without seeing each other.
"""

from __future__ import annotations

import asyncio
import contextvars
import runpy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor, MockResourceArgs
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from frontier.config.schema import Settings
from frontier.targets import load_stack
from infra.outputs import StackOutputs, as_dict
from infra.program import build
from tests.infra.cloud_mocks import ACCOUNT_ID, ELB_ACCOUNTS, ROOT_DEVICE, CloudMocks

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"
CLOUD_STACKS = ("dev", "staging", "prod")
__all__ = ["ACCOUNT_ID", "ELB_ACCOUNTS", "ROOT_DEVICE", "CloudMocks"]


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    urn: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    custom: bool
    options: pulumi.ResourceOptions | None = None
    # The URNs the engine is told this resource waits for: explicit ``depends_on`` (a component
    # expanded to its resources) and every resource whose outputs feed an input.
    dependencies: frozenset[str] = frozenset()

    @property
    def ignored_changes(self) -> list[str]:
        return list((self.options.ignore_changes if self.options else None) or [])

    @property
    def parent_types(self) -> list[str]:
        """The component types above this resource, from its URN (``...::parent$child::name``)."""
        qualified = self.urn.split("::")[-2]
        return qualified.split("$")[:-1]


@dataclass
class Graph:
    """Everything one program run created, resolved to plain values."""

    settings: Settings
    resources: list[Resource]
    outputs: dict[str, Any]
    invokes: list[tuple[str, dict[str, Any]]]
    seconds: float
    cpu_seconds: float

    @property
    def stack(self) -> str:
        return self.settings.stack

    def of_type(self, *types: str) -> list[Resource]:
        return [r for r in self.resources if r.type in types]

    def one(self, typ: str, name: str | None = None) -> Resource:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {typ} named {name!r}, found {[r.name for r in found]}"
        return found[0]

    def by_id(self, resource_id: str) -> Resource:
        found = [r for r in self.resources if r.id == resource_id]
        assert len(found) == 1, f"expected one resource with id {resource_id!r}, found {len(found)}"
        return found[0]


class _Recorder(CloudMocks):
    def __init__(self, region: str, **kwargs: Any) -> None:
        super().__init__(region, **kwargs)
        self.created: list[tuple[MockResourceArgs, str, dict[str, Any]]] = []

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, outputs = super().new_resource(args)
        self.created.append((args, resource_id, outputs))
        return resource_id, outputs


def _resolve(value: Any) -> Any:
    if isinstance(value, pulumi.Output):
        return _sync_await(value.future())
    if isinstance(value, list | tuple):
        return [_resolve(v) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    return value


class DependencyMonitor(MockMonitor):
    """The mock monitor, keeping what the engine orders creation by: each resource's dependencies."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.dependencies: dict[str, frozenset[str]] = {}

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (the gRPC method's name)
        response = super().RegisterResource(request)
        self.dependencies[response.urn] = frozenset(request.dependencies)
        return response


class EngineUrnMonitor(DependencyMonitor):
    """A monitor that makes URNs and aliases as the engine does, and keeps each resource's aliases.

    The engine's URN holds the types of all the resource's parents below the stack; the mock
    monitor's keeps only the nearest, so moving a component under another would not show in it.
    Aliases come as whole URNs (the SDK resolves a resource's own); a child inherits each of its
    parent's, renamed as the engine renames them (its step generator's ``generateAliases``): the
    parent's type chain, and the parent's old name in place of its new one where the child's name
    starts with it.
    """

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.aliases: dict[str, list[str]] = {}

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        qualified = parent.split("::")[2] if parent else ""
        if qualified and qualified != "pulumi:pulumi:Stack":
            type_ = f"{qualified}${type_}"
        return "::".join([f"urn:pulumi:{pulumi.get_stack()}", pulumi.get_project(), type_, name])

    def GetDeploymentInfo(self, request: Any) -> Any:  # noqa: N802 (the gRPC method's name)
        features = super().GetDeploymentInfo(request).supportedFeatures
        return resource_pb2.DeploymentInfo(
            supportedFeatures=[f for f in features if f != resource_pb2.RESOURCE_MONITOR_FEATURE_ALIAS_SPECS]
        )

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802
        response = super().RegisterResource(request)
        parent_name = request.parent.split("::")[-1]
        inherited = []
        for alias in self.aliases.get(request.parent, []):
            prefix, project, qualified, alias_name = alias.split("::")
            name = request.name
            if name.startswith(parent_name):
                name = alias_name + name.removeprefix(parent_name)
            inherited.append("::".join([prefix, project, f"{qualified}${request.type}", name]))
        self.aliases[response.urn] = [*request.aliasURNs, *inherited]
        return response


def _run(
    settings: Settings,
    program: Callable[[Settings], Any],
    mocks: _Recorder,
    monitor: DependencyMonitor | None = None,
) -> Graph:
    monitor = monitor or DependencyMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="frontier", stack=settings.stack, preview=False, monitor=monitor)
    result: dict[str, Any] = {}
    started, cpu_started = time.perf_counter(), time.process_time()
    options: dict[tuple[str, str], pulumi.ResourceOptions] = {}

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        # The engine, not the mocks, sees resource options: keep them for the tests here.
        options[(args.type_, args.name)] = args.opts

    def main() -> None:
        pulumi.runtime.register_stack_transformation(record)
        result.setdefault("outputs", program(settings))

    _sync_await(run_pulumi_func(main))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started

    urns = {}
    for urn in monitor.resources:
        qualified, name = urn.split("::")[-2:]
        urns[(qualified.split("$")[-1], name)] = urn
    resources = [
        Resource(
            args.typ,
            args.name,
            urns[(args.typ, args.name)],
            resource_id,
            dict(args.inputs),
            outputs,
            bool(args.custom),
            options.get((args.typ, args.name)),
            monitor.dependencies.get(urns[(args.typ, args.name)], frozenset()),
        )
        for args, resource_id, outputs in mocks.created
    ]
    produced = result.get("outputs")
    if isinstance(produced, StackOutputs):  # build() called directly
        outputs = _resolve(as_dict(produced))
    else:  # the entry point ran: what it exported
        outputs = _resolve(dict(pulumi.runtime.settings.get_root_resource().outputs))
    return Graph(settings, resources, outputs, list(mocks.invokes), elapsed, cpu)


def run_program(settings: Settings, program: Callable[[Settings], Any] = build, **mock_options: Any) -> Graph:
    """Run ``program(settings)`` under fresh mocks: :func:`infra.program.build` or the entry point."""
    mocks = _Recorder(settings.region, **mock_options)
    _ensure_event_loop()
    return contextvars.Context().run(_run, settings, program, mocks)


def _ensure_event_loop() -> None:
    """Pulumi's mocks register resources on the thread's current event loop; an ``asyncio.run``
    earlier in the session (the gateway's tests) leaves none set, and then they find none."""
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())


def run_main(stack: str, settings: Settings | None = None) -> Graph:
    """Run ``infra/__main__.py`` as ``pulumi up -s <stack>`` does; ``settings`` only sets up the mocks."""
    settings = (settings or load_stack(stack)).model_copy(update={"stack": stack})
    return run_program(settings, program=lambda _: runpy.run_path(str(MAIN)))


run_graphs: dict[str, Graph] = {}


def graph_for(stack: str) -> Graph:
    """The program's resources and exported outputs for a stack, built once per test session."""
    if stack not in run_graphs:
        run_graphs[stack] = run_main(stack)
    return run_graphs[stack]
