"""IAM scope: what a grant, a trust policy or a resource policy lets its holder do (frontier/identity/,
infra/workload_identity.py, and the resource policies of infra/storage.py and infra/secret_store.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from policy.rules.reading import as_list, get, policy_document, statements
from policy.rules.storage import (
    BUCKET,
    BUCKET_POLICY,
    ECR_REPOSITORY_POLICY,
    KMS_KEY,
    KMS_KEY_POLICY,
    SECRET_POLICY,
)
from policy.rules.validation import resource_policy

# Services whose actions read or write data; a wildcard action on any of them is refused.
DATA_SERVICES = (
    "s3",
    "secretsmanager",
    "kms",
    "dynamodb",
    "ssm",
    "ecr",
    "logs",
    "sqs",
    "sns",
    "rds",
    "rds-data",
)
# Of those, the ones whose data actions must also name their resources (never "Resource": "*").
SCOPED_DATA_SERVICES = ("s3", "secretsmanager", "kms", "dynamodb")
IAM_POLICY = (
    "aws:iam/policy:Policy",
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
)
IAM_ROLE = ("aws:iam/role:Role",)
IAM_ATTACHMENT = (
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:iam/policyAttachment:PolicyAttachment",
    "aws:iam/userPolicyAttachment:UserPolicyAttachment",
    "aws:iam/groupPolicyAttachment:GroupPolicyAttachment",
)
# Actions that amount to administering the account when granted on every resource: handing any role
# to a service (iam:PassRole), rewriting IAM itself, or assuming any role.
ESCALATING_ACTIONS = ("*", "iam:*", "sts:*")
PASS_ROLE = "iam:PassRole"
ADMIN_MANAGED_POLICY = re.compile(
    r"^arn:aws[\w-]*:iam::aws:policy/(AdministratorAccess|PowerUserAccess|IAMFullAccess)$"
)


def _wildcard_problems(document: Mapping[str, Any], where: str) -> Iterator[str]:
    for index, statement in enumerate(statements(document)):
        if get(statement, "Effect") != "Allow":
            continue
        sid = get(statement, "Sid", default=f"#{index}")
        if get(statement, "NotAction") is not None:
            yield f"{where} statement {sid}: Allow with NotAction grants everything not listed"
            continue
        actions = [str(a) for a in as_list(get(statement, "Action"))]
        resources = [str(r) for r in as_list(get(statement, "Resource"))]
        for action in actions:
            service, _, verb = action.partition(":")
            if action == "*" or (service.lower() in DATA_SERVICES and "*" in verb):
                yield f"{where} statement {sid}: wildcard action {action!r} on a data service"
            elif service.lower() in SCOPED_DATA_SERVICES and "*" in resources:
                yield f"{where} statement {sid}: {action} on every resource ('*'); name the bucket, secret or key"


def check_no_wildcard_data_actions(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in IAM_ROLE:
        for inline in as_list(get(props, "inlinePolicies")):
            yield from _wildcard_problems(
                policy_document(get(inline, "policy")), f"inline policy {get(inline, 'name')}"
            )
        return
    yield from _wildcard_problems(policy_document(get(props, "policy")), "policy")


def _matches(pattern: str, action: str) -> bool:
    """An IAM action pattern (``*`` and ``?`` wildcards, case-insensitive) against one action."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, action.lower()) is not None


def _principals(statement: Mapping[str, Any]) -> list[str]:
    principal = get(statement, "Principal")
    if isinstance(principal, Mapping):
        return [str(p) for value in principal.values() for p in as_list(value)]
    return [str(p) for p in as_list(principal)]


def _escalation_problems(document: Mapping[str, Any], where: str) -> Iterator[str]:
    for index, statement in enumerate(statements(document)):
        if get(statement, "Effect") != "Allow":
            continue
        sid = get(statement, "Sid", default=f"#{index}")
        resources = [str(r) for r in as_list(get(statement, "Resource"))]
        if "*" not in resources and get(statement, "NotResource") is None:
            continue
        for action in (str(a) for a in as_list(get(statement, "Action"))):
            if action.lower() in ESCALATING_ACTIONS or _matches(action, PASS_ROLE):
                yield f"{where} statement {sid}: {action!r} on every resource lets its holder administer the account"


def _trust_problems(document: Mapping[str, Any]) -> Iterator[str]:
    for index, statement in enumerate(statements(document)):
        if get(statement, "Effect") == "Allow" and "*" in _principals(statement):
            sid = get(statement, "Sid", default=f"#{index}")
            yield f"trust policy statement {sid}: Principal '*' lets any AWS account assume the role"


def check_no_account_admin(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in IAM_ATTACHMENT:
        arn = str(get(props, "policyArn", default=""))
        if ADMIN_MANAGED_POLICY.match(arn):
            yield f"attaches the AWS managed policy {arn.rsplit('/', 1)[-1]}"
        return
    if args.resource_type in IAM_ROLE:
        yield from _trust_problems(policy_document(get(props, "assumeRolePolicy")))
        for arn in (str(a) for a in as_list(get(props, "managedPolicyArns"))):
            if ADMIN_MANAGED_POLICY.match(arn):
                yield f"attaches the AWS managed policy {arn.rsplit('/', 1)[-1]}"
        for inline in as_list(get(props, "inlinePolicies")):
            yield from _escalation_problems(
                policy_document(get(inline, "policy")), f"inline policy {get(inline, 'name')}"
            )
        return
    yield from _escalation_problems(policy_document(get(props, "policy")), "policy")


def check_resource_policy_not_public(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # A Deny to everyone (the TLS-only statement) is how a policy narrows access, so only Allow counts.
    for index, statement in enumerate(statements(policy_document(get(props, "policy")))):
        if get(statement, "Effect") != "Allow" or "*" not in _principals(statement):
            continue
        if not get(statement, "Condition"):
            sid = get(statement, "Sid", default=f"#{index}")
            yield f"resource policy statement {sid}: Principal '*' with no Condition grants anyone on the internet"


POLICIES = [
    resource_policy(
        "no-wildcard-iam-on-data",
        "IAM policies grant no wildcard actions on data services.",
        IAM_POLICY + IAM_ROLE,
        check_no_wildcard_data_actions,
    ),
    resource_policy(
        "iam-no-account-admin",
        "No IAM grant of iam:PassRole, iam:*, sts:* or * on every resource, no trust of Principal '*', "
        "no AWS managed admin policies.",
        IAM_POLICY + IAM_ROLE + IAM_ATTACHMENT,
        check_no_account_admin,
    ),
    resource_policy(
        "resource-policies-not-public",
        "Bucket, key, secret and repository policies grant Principal '*' only under a Condition.",
        BUCKET_POLICY + BUCKET + KMS_KEY + KMS_KEY_POLICY + SECRET_POLICY + ECR_REPOSITORY_POLICY,
        check_resource_policy_not_public,
    ),
]
