"""The local stack's IAM: moto's server enforces it, and every actor signs with an identity of its own.

moto's server is started with ``INITIAL_NO_AUTH_ACTION_COUNT`` = :data:`UNCHECKED_CALLS`: its first
calls (creating the admin user, its policy and its access key) go unchecked, and every later call
must be signed with an access key of an IAM user and be allowed by that user's policies. The users,
each with an access key kept in ``<state_dir>/iam.json`` (mode 0600):

``admin``
    what ``pulumi up`` is on a cloud stack: it creates the buckets, the API-key secret, the tenants'
    secrets and the users below. Nothing else signs with it.
``host`` (``host-<model>`` for each pool where the stack file lists its models)
    a host slot's bootstrap, agent, metrics publisher and runtime: its pool's runtime principal,
    :func:`frontier.identity.documents.runtime_policy` (``hosts=True``) for that pool's weights,
    secret and history, and :func:`frontier.identity.documents.lifecycle_policy`. A slot of one pool
    cannot read another pool's weights.
``deploy``
    ``fab``: the deploy role, :func:`frontier.identity.documents.deploy_policy`, over every pool.
``gateway``
    the gateway process (stacks with a gateway): its role's statements as ``infra/gateway.py``
    grants them (written there inline, so :func:`gateway_policy` restates them; a test runs the
    cloud program under Pulumi's mocks and holds the two equal).

The documents are the cloud program's, rendered with the local stack's names in place of the cloud's
ARNs (its buckets, its history prefix, its secrets), then made readable to moto (:func:`for_moto`).

What moto evaluates, and what it does not (see ``moto/iam/access_control.py``):

* the **action** of every call, against the Action of each statement;
* the **resource** of S3 calls (``arn:aws:s3:::bucket`` and ``arn:aws:s3:::bucket/key``), of IAM,
  STS and SQS calls, and of Secrets Manager calls (the secret's ARN: the local stack's moto server
  adds that, :mod:`frontier.targets.local.moto_calls`, so one pool's host cannot read another pool's
  key secret). Calls to other services are checked as if their resource were ``*``, so a statement
  scoped to a log group's ARN would never match one: :func:`for_moto` widens those statements'
  resources to ``*`` and keeps their actions as they are;
* actions by moto's names where they differ from IAM's: ``s3:HeadBucket`` for the HeadBucket call
  (AWS checks ``s3:ListBucket``), ``monitoring:*`` for CloudWatch's (``cloudwatch:*``), added beside
  the document's own;
* not **conditions**: a statement's Condition (``s3:prefix``, ``kms:ViaService``,
  ``cloudwatch:namespace``, ``aws:ResourceTag/...``, ``aws:SourceVpc``) is taken as met. The
  conditions are pinned instead by the Pulumi-mock tests of the rendered documents
  (``tests/infra/test_access.py``) and by the policy pack's rules (``tests/infra/test_policy.py``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier import project
from frontier.config.schema import Host, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.identity.cloud import Cloud
from frontier.identity.documents import deploy_policy, lifecycle_policy, runtime_policy
from frontier.identity.gateway import tokenizer_arns, tokenizer_statements
from frontier.identity.key_policies import release_key_policy
from frontier.identity.pools import StackResources, pool_identity, principal_suffix, stack_identity
from frontier.release.signing import create_release_key

# The calls moto lets through unchecked: create the admin user, give it its policy, make its key.
UNCHECKED_CALLS = 3
MOTO_ENV = {"INITIAL_NO_AUTH_ACTION_COUNT": str(UNCHECKED_CALLS)}
CREDENTIALS_FILE = "iam.json"
# The release key provision made (frontier.release.signing): its ARN, which the documents name.
RELEASE_KEY_FILE = "release-key.json"
ACCOUNT_ID = "123456789012"  # moto's default account: the one every local ARN names
# The services whose calls moto checks against a resource ARN; any other call is checked as if its
# resource were "*" (moto/core/responses.py: only these define the call's resource; Secrets
# Manager's is defined by the local stack's server, frontier.targets.local.moto_calls).
RESOURCE_CHECKED = frozenset({"s3", "iam", "sts", "sqs", "secretsmanager"})
# Actions moto checks against "*" although their service is resource-checked: sqs:GetQueueUrl names
# its queue by QueueName, and moto finds the call's queue by its URL, which that call has not yet.
MOTO_UNRESOLVED = frozenset({"sqs:GetQueueUrl"})
# AWS authorises HeadBucket with s3:ListBucket; moto checks it as s3:HeadBucket.
MOTO_ALIASES = {"s3:ListBucket": ("s3:HeadBucket",)}
# moto names an action after the service's signing name, which is CloudWatch's API host
# (cloudwatch:PutMetricData is checked as monitoring:PutMetricData).
MOTO_PREFIXES = {"cloudwatch": "monitoring"}
ADMIN_DOCUMENT = {
    "Version": "2012-10-17",
    "Statement": [{"Sid": "StandsInForPulumi", "Effect": "Allow", "Action": "*", "Resource": "*"}],
}


class IdentityError(FrontierError):
    """The local stack's identities cannot be created or read."""


@dataclass(frozen=True)
class AccessKey:
    key_id: str
    secret: str

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret}

    def boto3_kwargs(self) -> dict[str, str]:
        return {"aws_access_key_id": self.key_id, "aws_secret_access_key": self.secret}


def user_name(settings: Settings, actor: str) -> str:
    return f"frontier-{settings.stack}-{actor}"


# --- the documents ---------------------------------------------------------------------------------


def host_actor(settings: Settings, pool: PoolSettings) -> str:
    """The user ``pool``'s host slots sign as: ``host`` on a one-model stack, ``host-<model>`` where
    the file lists its models (each pool's hosts a principal of their own, as on a cloud stack)."""
    return "host" + principal_suffix(settings, pool)


def pool_of_host(settings: Settings, host: Host) -> PoolSettings:
    """The pool whose replica ``host`` runs: the pool that lists it (a one-model stack's every host,
    the spare slots its pool does not list included)."""
    alone = len(settings.pools) == 1
    found = [pool for pool in settings.pools if alone or host in pool.hosts]
    if len(found) != 1:
        raise IdentityError(
            f"inventory host {host.name!r}: listed by {len(found)} pools ({', '.join(p.name for p in found) or 'none'}); "
            "each host runs exactly one pool"
        )
    return found[0]


def documents(
    settings: Settings, history_bucket: str, history_prefix: str, release_key: str | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each actor's policy documents by name, rendered by :mod:`frontier.identity` as the cloud
    program renders them: one host actor per pool, scoped to that pool's weights, secret and history.
    ``release_key``: the release key's ARN (default: the one the stack's state records)."""
    cloud = _cloud(settings)
    found = _resources(settings, history_bucket, history_prefix, release_key)
    stack = stack_identity(settings, cloud, found, ssm_access=False)
    everyone: dict[str, dict[str, dict[str, Any]]] = {"admin": {"admin": ADMIN_DOCUMENT}}
    for pool in settings.pools:
        pool_args = pool_identity(settings, pool, stack, found)
        everyone[host_actor(settings, pool)] = {
            "lifecycle": lifecycle_policy(cloud, settings.stack).as_dict(),
            f"runtime-{pool.name}": runtime_policy(pool_args, hosts=True).as_dict(),
        }
    everyone["deploy"] = {"deploy": deploy_policy(stack).as_dict()}
    if settings.gateway is not None:
        everyone["gateway"] = {"gateway": gateway_policy(settings)}
    return everyone


def actors(settings: Settings) -> tuple[str, ...]:
    """Every user of the stack: the admin, each pool's host actor, the deploy role, the gateway."""
    return (
        "admin",
        *(host_actor(settings, pool) for pool in settings.pools),
        "deploy",
        *(("gateway",) if settings.gateway is not None else ()),
    )


def gateway_policy(settings: Settings) -> dict[str, Any]:
    """The statements ``infra/gateway.py`` grants the gateway's role, with the local stack's names.

    The local gateway meters to a file, so its S3 statement names the metering location only when
    that is a bucket.
    """
    cloud = _cloud(settings)
    secrets = [*(t.api_key_secret for t in settings.tenants), *settings.api_keys_secrets.values()]
    statements: list[dict[str, Any]] = [
        _allow(
            "ReadKeyDigests",
            "secretsmanager:GetSecretValue",
            [cloud.arn("secretsmanager", f"secret:{name}-*") for name in secrets],
        ),
        _allow("DecryptSecrets", "kms:Decrypt", _key_arn(settings)),
        _allow("DiscoverRuntimes", "ec2:DescribeInstances", "*"),
    ]
    assert settings.gateway is not None
    uri = settings.gateway.metering.uri
    if uri.startswith("s3://"):
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        statements.append(
            _allow(
                "WriteMetering", "s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix.strip('/') or 'metering'}/*"
            )
        )
        # The bucket encrypts with the stack's key: a new object's data key, asked for via S3.
        encrypt = _allow("EncryptMetering", "kms:GenerateDataKey", _key_arn(settings))
        encrypt["Condition"] = {"StringEquals": {"kms:ViaService": f"s3.{settings.region}.amazonaws.com"}}
        statements.append(encrypt)
    statements.extend(tokenizer_statements(tokenizer_arns(settings)))
    return {"Version": "2012-10-17", "Statement": statements}


def for_moto(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as moto can check it: resources of services moto checks as ``*`` widened to ``*``,
    and the names moto uses for an action added beside AWS's (see the module docstring)."""
    rendered = copy.deepcopy(document)
    for statement in rendered["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        services = {action.split(":", 1)[0] for action in actions}
        if not services <= RESOURCE_CHECKED or MOTO_UNRESOLVED & set(actions):
            statement["Resource"] = "*"
        extra = [alias for action in actions for alias in MOTO_ALIASES.get(action, ())]
        extra += [
            f"{MOTO_PREFIXES[service]}:{name}"
            for service, _, name in (action.partition(":") for action in actions)
            if service in MOTO_PREFIXES
        ]
        if extra:
            statement["Action"] = [*actions, *extra]
    return rendered


def _cloud(settings: Settings) -> Cloud:
    return Cloud(
        account_id=ACCOUNT_ID,
        partition="aws",
        region=settings.region,
        dns_suffix="amazonaws.com",
        availability_zones=(),
        elb_account_arn="",
    )


def _resources(
    settings: Settings, history_bucket: str, history_prefix: str, release_key: str | None = None
) -> StackResources:
    """The local stack's resources by the names it gives them, as ARNs."""
    cloud = _cloud(settings)
    weights_bucket, _, weights_prefix = settings.weights_root.removeprefix("s3://").partition("/")
    return StackResources(
        weights_bucket_arn=f"arn:aws:s3:::{weights_bucket}",
        weights_prefix=weights_prefix.strip("/"),
        history_bucket_arn=f"arn:aws:s3:::{history_bucket}",
        history_prefix=history_prefix,
        kms_key_arn=_key_arn(settings),
        api_keys_secret_arns={
            name: cloud.arn("secretsmanager", f"secret:{name}-*")
            for name in settings.api_keys_secrets.values()
        },
        repository_arn=cloud.arn("ecr", f"repository/frontier-{settings.stack}-runtime"),
        target_group_arn=cloud.arn("elasticloadbalancing", f"targetgroup/frontier-{settings.stack}/local"),
        release_key_arn=release_key_arn(settings) if release_key is None else release_key,
    )


def user_arn(settings: Settings, actor: str) -> str:
    """The ARN of ``actor``'s user, as IAM names it (``aws:PrincipalArn`` of its calls)."""
    return _cloud(settings).arn("iam", f"user/{user_name(settings, actor)}", regional=False)


def release_key_arn(settings: Settings) -> str:
    """The local release key's ARN as :func:`provision` recorded it; "" before it made one. moto
    names a key by a random id, so the documents learn it here, after the key exists."""
    if settings.local is None:
        return ""
    try:
        return str(
            json.loads((project.resolve(settings.local.state_dir) / RELEASE_KEY_FILE).read_text())["arn"]
        )
    except (OSError, ValueError, KeyError):
        return ""


def _key_arn(settings: Settings) -> str:
    # moto's S3 and Secrets Manager encrypt nothing with a key of the stack; the ARN only names one.
    # A key's ARN (key/<id>), not its alias's: a cloud stack's documents name the key itself, and
    # KMS authorises a call on the key, so the call log's KMS calls (tests/e2e/iam_simulation.py)
    # name the same ARN.
    return _cloud(settings).arn("kms", f"key/frontier-{settings.stack}")


def _allow(sid: str, actions: str | list[str], resources: Any) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources}


# --- the users and their keys ----------------------------------------------------------------------


def credentials_file(state_dir: Path) -> Path:
    return state_dir / CREDENTIALS_FILE


def read_keys(state_dir: Path) -> dict[str, AccessKey]:
    """The access keys ``provision`` wrote; empty where it has not run (or moto checks nothing)."""
    try:
        data = json.loads(credentials_file(state_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {actor: AccessKey(**key) for actor, key in data.items()}


def provision(
    settings: Settings,
    endpoint: str,
    state_dir: Path,
    history_bucket: str,
    history_prefix: str,
    *,
    fresh: bool,
) -> tuple[str, dict[str, AccessKey]]:
    """Create (``fresh``: moto just started) or bring up to date each actor's user, policies and key.

    Returns what happened, for ``local.up``'s report, and the keys by actor. Idempotent: a user
    that exists gets its policies put again (a changed stack file changes them), a key on file is kept.
    """
    import boto3

    keys = {} if fresh else read_keys(state_dir)
    if fresh:
        # moto lets UNCHECKED_CALLS calls through unsigned-for: exactly these three.
        iam = boto3.client(
            "iam", endpoint_url=endpoint, region_name=settings.region,
            aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap",
        )  # fmt: skip
        admin = user_name(settings, "admin")
        iam.create_user(UserName=admin)
        iam.put_user_policy(UserName=admin, PolicyName="admin", PolicyDocument=json.dumps(ADMIN_DOCUMENT))
        made = iam.create_access_key(UserName=admin)["AccessKey"]
        keys["admin"] = AccessKey(made["AccessKeyId"], made["SecretAccessKey"])
    if "admin" not in keys:
        raise IdentityError(
            f"{credentials_file(state_dir)}: no admin key for the running moto server (it was started "
            f"without the stack's identities): `fab local.down --stack {settings.stack}` then `fab local.up`"
        )
    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name=settings.region, **keys["admin"].boto3_kwargs()
    )
    # The release key first, as the Foundation makes it before the roles: the documents name it.
    kms = boto3.client(
        "kms", endpoint_url=endpoint, region_name=settings.region, **keys["admin"].boto3_kwargs()
    )
    release_key = create_release_key(kms, settings.stack)
    (state_dir / RELEASE_KEY_FILE).write_text(json.dumps({"arn": release_key.arn}, indent=2) + "\n")
    wanted = documents(settings, history_bucket, history_prefix, release_key.arn)
    for actor, policies in wanted.items():
        if actor == "admin":
            continue
        name = user_name(settings, actor)
        with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
            iam.create_user(UserName=name)
        for policy_name, document in policies.items():
            iam.put_user_policy(
                UserName=name, PolicyName=policy_name, PolicyDocument=json.dumps(for_moto(document))
            )
        if actor not in keys:
            made = iam.create_access_key(UserName=name)["AccessKey"]
            keys[actor] = AccessKey(made["AccessKeyId"], made["SecretAccessKey"])
    # The release key's policy as the cloud program puts it once its deploy role exists: the deploy
    # user alone signs. moto stores it but evaluates no key policy on kms:Sign (only an unconditional
    # Deny of DescribeKey), so here the deploy user's document is what keeps the others from signing;
    # tests/infra/test_release_key_policy.py evaluates this policy as AWS would.
    kms.put_key_policy(
        KeyId=release_key.arn,
        PolicyName="default",
        Policy=release_key_policy(_cloud(settings), user_arn(settings, "deploy")),
    )
    _write_keys(state_dir, keys)
    users = ", ".join(a for a in actors(settings) if a in keys)
    return (
        f"users {users} (moto checks every call against their policies); keys in {credentials_file(state_dir)} (mode 0600)",
        keys,
    )


def _write_keys(state_dir: Path, keys: dict[str, AccessKey]) -> None:
    path = credentials_file(state_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(
            {actor: {"key_id": k.key_id, "secret": k.secret} for actor, k in keys.items()}, out, indent=2
        )
    tmp.replace(path)


# --- what a refusal says ---------------------------------------------------------------------------

_XML_FIELD = r"<{0}>(.*?)</{0}>"


def refusal(exc: Exception) -> str:
    """One line for an AWS error: its code, the operation, and moto's words (which name the action).

    moto answers a refused call of a JSON service with an XML body that botocore cannot parse; the
    code and message are read out of it, so the line says AccessDenied and the action, not a 403.
    """
    response = getattr(exc, "response", {}) or {}
    error = response.get("Error", {})
    code, message = str(error.get("Code", type(exc).__name__)), str(error.get("Message", exc))
    if "<Message>" in message:
        found_code = re.search(_XML_FIELD.format("Code"), message)
        found_message = re.search(_XML_FIELD.format("Message"), message)
        code = found_code.group(1) if found_code else code
        message = found_message.group(1) if found_message else message
    operation = getattr(exc, "operation_name", "")
    return " ".join(f"{code} on {operation}: {message}".split()) if operation else f"{code}: {message}"
