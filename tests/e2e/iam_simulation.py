"""The local stack's call log, evaluated as AWS would: the unwidened documents, conditions included.

moto's server records each call it allows (:mod:`frontier.targets.local.moto_calls`): principal,
IAM action, the resource's ARN, and the request context keys. Here each call of an actor of the
stack (host, deploy, gateway; the admin stands in for ``pulumi up``) is evaluated against that
actor's documents as ``frontier/identity/`` renders them for AWS (``iam.documents``, before
``iam.for_moto`` widens them) by ``@cloud-copilot/iam-simulate`` (``tools/iam-simulate/``).

Calls AWS makes on the caller's behalf that moto never does are added: the cloud's weights and
history buckets and the API-keys secret are encrypted with the stack's KMS key, so a GET of an
object or a secret is also a ``kms:Decrypt`` and a PUT a ``kms:GenerateDataKey``, via that
service (``kms:ViaService``), by the same principal.

The same evaluation reads the EC2 stack's log (``tests/e2e/test_ec2_actors.py``): its documents,
key and buckets are handed in (:class:`Account`); a statement is needed where a call of either log
needs it (:func:`needed_across`).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from frontier import project
from frontier.config.schema import Settings
from frontier.targets.local import cluster as local
from frontier.targets.local import iam

TOOL = project.root() / "tools" / "iam-simulate"
# Every actor but the admin (which stands in for `pulumi up`): each pool's host actor, the deploy
# role, the gateway.
UNCHECKED_ACTORS = frozenset({"admin"})
# Condition keys AWS documents that the simulator's data cannot type, each evaluated under a global
# key of the same type (a string) in the documents and the calls alike: ec2:osuser, which EC2
# Instance Connect's SendSSHPublicKey sets, is listed under ec2-instance-connect's keys, and the
# simulator looks an ec2: key up among EC2's only ("Condition key ec2:osuser not found").
SIMULATOR_KEYS = {"ec2:osuser": "aws:PrincipalTag/ec2-osuser"}
# The parameters AWS publishes (the AMI ids) have ARNs without an account, which the simulator cannot
# match to SSM's parameter type (its ${Account} takes one character or more): in the documents and
# the calls alike, the empty account of an SSM parameter ARN reads "aws", so the two still match
# exactly where they matched before and nowhere else.
PUBLISHED_PARAMETER = re.compile(r"(arn:aws:ssm:[^:\"]*)::parameter/")


@dataclass(frozen=True)
class Call:
    principal: str
    action: str
    resource: str
    context: tuple[tuple[str, str], ...]
    operation: str

    def request(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "action": self.action,
            "resource": self.resource,
            # AWS sets aws:PrincipalArn on every request (a role's ARN for its sessions, a user's
            # for the user); the simulator takes it from the context only, and a key policy's
            # ArnNotEquals on it (the release key's) would otherwise match every caller.
            "context": {"aws:PrincipalArn": self.principal, **dict(self.context)},
        }

    def describe(self) -> str:
        context = ", ".join(f"{k}={v!r}" for k, v in self.context)
        return f"{self.principal.rsplit('/', 1)[-1]}: {self.action} on {self.resource}" + (
            f" [{context}]" if context else ""
        )


def principal_arn(settings: Settings, actor: str) -> str:
    return f"arn:aws:iam::{iam.ACCOUNT_ID}:user/{iam.user_name(settings, actor)}"


def actor_documents(settings: Settings) -> dict[str, dict[str, dict[str, Any]]]:
    """Each checked actor's documents by name, as AWS would hold them (not widened for moto)."""
    found = iam.documents(settings, local.history_bucket(settings), local.history_prefix(settings))
    return {actor: policies for actor, policies in found.items() if actor not in UNCHECKED_ACTORS}


def _encrypted_buckets(settings: Settings) -> set[str]:
    return {local.history_bucket(settings)} | {
        pool.model.weights_uri.removeprefix("s3://").split("/", 1)[0] for pool in settings.pools
    }


@dataclass(frozen=True)
class Account:
    """What a stack's evaluation needs besides its log: each actor's documents, the stack's KMS key
    and the buckets that key encrypts."""

    documents: dict[str, dict[str, dict[str, Any]]]
    key_arn: str
    encrypted_buckets: frozenset[str]


def local_account(settings: Settings) -> Account:
    """The local stack's: the documents ``local.up`` rendered, its key's ARN, its buckets."""
    return Account(actor_documents(settings), iam._key_arn(settings), frozenset(_encrypted_buckets(settings)))


def implied(settings: Settings, call: Call, account: Account | None = None) -> list[Call]:
    """The KMS calls AWS makes for ``call`` with the caller's permissions (see the module docstring)."""
    account = account or local_account(settings)
    region = settings.region
    key = account.key_arn
    kms_action = ""
    via = ""
    if call.action.startswith("s3:") and call.resource.startswith("arn:aws:s3:::"):
        bucket = call.resource.removeprefix("arn:aws:s3:::").split("/", 1)[0]
        if bucket in account.encrypted_buckets and "/" in call.resource.removeprefix("arn:aws:s3:::"):
            via = f"s3.{region}.amazonaws.com"
            if call.action in ("s3:GetObject", "s3:GetObjectVersion"):
                kms_action = "kms:Decrypt"
            elif call.action == "s3:PutObject":
                kms_action = "kms:GenerateDataKey"
    elif call.action in ("secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue"):
        via = f"secretsmanager.{region}.amazonaws.com"
        kms_action = "kms:Decrypt" if call.action.endswith("GetSecretValue") else "kms:GenerateDataKey"
    if not kms_action:
        return []
    return [Call(call.principal, kms_action, key, (("kms:ViaService", via),), f"{call.operation} (KMS)")]


def calls_of(settings: Settings, log: Iterable[dict[str, Any]], account: Account | None = None) -> list[Call]:
    """The distinct calls of the checked actors in ``log``, with the KMS calls they imply."""
    checked = {*iam.actors(settings), "gateway"} - UNCHECKED_ACTORS
    principals = {principal_arn(settings, actor) for actor in checked}
    seen: dict[Call, None] = {}
    for line in log:
        if line["principal"] not in principals:
            continue
        call = Call(
            line["principal"],
            line["action"],
            line["resource"],
            tuple(sorted(line.get("context", {}).items())),
            line.get("operation", ""),
        )
        for one in (call, *implied(settings, call, account)):
            seen.setdefault(one)
    return list(seen)


def simulate(
    policy_sets: dict[str, dict[str, list[dict[str, Any]]]],
    calls: list[Call],
    resource_policies: dict[str, dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Each policy set's decisions on ``calls``, in order (one Node process for all of them)."""
    node = shutil.which("node")
    assert node, "node is not on PATH: tools/iam-simulate needs Node 18+ (scripts/system-packages.sh)"
    assert (TOOL / "node_modules" / "@cloud-copilot" / "iam-simulate").is_dir(), (
        f"{TOOL}/node_modules is missing: run `npm ci` there (scripts/system-packages.sh does)"
    )
    payload = {
        "policySets": policy_sets,
        "calls": [c.request() for c in calls],
        "resourcePolicies": resource_policies or {},
    }
    text = json.dumps(payload)
    for key, stand_in in SIMULATOR_KEYS.items():
        text = text.replace(json.dumps(key), json.dumps(stand_in))
    text = PUBLISHED_PARAMETER.sub(r"\1:aws:parameter/", text)
    done = subprocess.run(
        [node, str(TOOL / "simulate.mjs")],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def role_decisions(role_arn: str, document: dict[str, Any], calls: list[tuple[str, str]]) -> list[str]:
    """What AWS decides for one role holding ``document`` on its ``(action, resource)`` calls."""
    made = [Call(role_arn, action, resource, (), action.split(":")[1]) for action, resource in calls]
    found = simulate({"all": {role_arn: [{"name": "policy", "policy": document}]}}, made)["all"]
    return [d["decision"] for d in found]


def policy_set(settings: Settings, documents: dict[str, dict[str, dict[str, Any]]]) -> dict[str, list]:
    return {
        principal_arn(settings, actor): [{"name": name, "policy": doc} for name, doc in policies.items()]
        for actor, policies in documents.items()
    }


@dataclass(frozen=True)
class Statement:
    actor: str
    policy: str
    sid: str


def statements(documents: dict[str, dict[str, dict[str, Any]]]) -> list[Statement]:
    return [
        Statement(actor, name, statement["Sid"])
        for actor, policies in documents.items()
        for name, document in policies.items()
        for statement in document["Statement"]
    ]


def without(documents: dict[str, dict[str, dict[str, Any]]], gone: Statement) -> dict:
    trimmed = copy.deepcopy(documents)
    document = trimmed[gone.actor][gone.policy]
    document["Statement"] = [s for s in document["Statement"] if s["Sid"] != gone.sid]
    return trimmed


@dataclass
class Evaluation:
    calls: list[Call]
    decisions: list[dict[str, Any]]
    # Per statement: the recorded calls that are denied once it alone is taken out.
    needed_by: dict[Statement, list[Call]]

    @property
    def denied(self) -> list[tuple[Call, dict[str, Any]]]:
        return [(c, d) for c, d in zip(self.calls, self.decisions, strict=True) if d["decision"] != "Allowed"]

    def unneeded(self) -> list[Statement]:
        return [s for s, calls in self.needed_by.items() if not calls]


def evaluate(settings: Settings, log: Iterable[dict[str, Any]], account: Account | None = None) -> Evaluation:
    """The recorded calls against the unwidened documents, and against each with one statement out
    (the local stack's documents unless ``account`` hands others in)."""
    account = account or local_account(settings)
    documents = account.documents
    calls = calls_of(settings, log, account)
    sets = {"all": policy_set(settings, documents)}
    every = statements(documents)
    for index, statement in enumerate(every):
        sets[f"without-{index}"] = policy_set(settings, without(documents, statement))
    # A KMS key answers to its key policy as well: the cloud program's, which lets the account's
    # IAM policies grant its use (without it, KMS refuses every identity policy's grant).
    from infra.secret_store import key_policy

    keys = {account.key_arn: json.loads(key_policy(iam._cloud(settings)))}
    # The release key answers to its own key policy (infra/release_key.py), on a stack that has one:
    # the deploy user alone signs.
    from frontier.identity.key_policies import release_key_policy

    if release_key := iam.release_key_arn(settings):
        keys[release_key] = json.loads(
            release_key_policy(iam._cloud(settings), principal_arn(settings, "deploy"))
        )
    results = simulate(sets, calls, keys)
    baseline = results["all"]
    needed_by = {
        statement: [
            call
            for call, before, after in zip(calls, baseline, results[f"without-{index}"], strict=True)
            if before["decision"] == "Allowed" and after["decision"] != "Allowed"
        ]
        for index, statement in enumerate(every)
    }
    return Evaluation(calls, baseline, needed_by)


def needed_across(*evaluations: Evaluation) -> dict[tuple[str, str], list[Call]]:
    """Per (actor, Sid): the calls of every evaluation denied once that statement alone is out. The
    stacks name their documents apart (one per pool), their statements alike."""
    needed: dict[tuple[str, str], list[Call]] = {}
    for evaluation in evaluations:
        for statement, calls in evaluation.needed_by.items():
            needed.setdefault((statement.actor, statement.sid), []).extend(calls)
    return needed
