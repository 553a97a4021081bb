"""How a rule becomes a pulumi-policy policy.

Each rule is a plain function: a resource rule ``check(props, args)`` sees one resource's inputs
(wrapped in a ``ResourceValidationPolicy``), a stack rule ``check(resources)`` every resource's
outputs (a ``StackValidationPolicy``), for properties that pulumi-aws 7 spreads over several
resources, such as a bucket and its encryption, versioning, public access block and policy. Both
yield their violations as messages; the wrappers name the resource in each report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)


def resource_policy(
    name: str,
    description: str,
    types: Sequence[str],
    check: Callable[[Mapping[str, Any], ResourceValidationArgs], Iterable[str]],
    enforcement: EnforcementLevel = EnforcementLevel.MANDATORY,
    config_schema: PolicyConfigSchema | None = None,
) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in types:
            return
        for message in check(args.props, args):
            report_violation(f"{args.name}: {message}", args.urn)

    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=enforcement,
        config_schema=config_schema,
    )


def stack_policy(
    name: str,
    description: str,
    check: Callable[[Sequence[PolicyResource]], Iterable[tuple[PolicyResource, str]]],
    enforcement: EnforcementLevel = EnforcementLevel.MANDATORY,
) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for resource, message in check(list(args.resources)):
            report_violation(f"{resource.name}: {message}", resource.urn)

    return StackValidationPolicy(
        name=name, description=description, validate=validate, enforcement_level=enforcement
    )


def of_type(resources: Iterable[PolicyResource], types: Sequence[str]) -> list[PolicyResource]:
    return [r for r in resources if r.resource_type in types]
