"""moto's server, recording every call its IAM enforcement lets through: the local stack's call log.

``python -m frontier.targets.local.moto_calls --log FILE <moto.server's arguments>`` runs moto's
server as ``python -m moto.server`` would, with two additions: a Secrets Manager call is authorised
on the secret it names, as AWS authorises it (moto checks it as if its resource were ``*``, so one
pool's host could read every pool's secret), and each signed call that moto's access control allows
appends one JSON line to ``FILE`` (``<state_dir>/moto-calls.jsonl`` for the local
stack, see :func:`frontier.targets.local.services.start_moto`)::

    {"principal": "arn:aws:iam::123456789012:user/frontier-local-deploy", "operation": "ListObjectsV2",
     "action": "s3:ListBucket", "resource": "arn:aws:s3:::frontier-local-history",
     "context": {"s3:prefix": "history/local/records/"}}

Why: moto checks the action of a call, and the resource of an S3 call only; it takes every
Condition as met and checks other services' calls as if their resource were ``*``
(:mod:`frontier.targets.local.iam`). The log says what AWS would evaluate instead: the action by
IAM's name (HeadBucket is ``s3:ListBucket``; a DELETE of a version is ``s3:DeleteObjectVersion``;
DeleteObjects is one ``s3:DeleteObject`` per key), the resource's real ARN (the secret's, the auto
scaling group's, the target group's, the log group's, the repository's, the instance's) and the
request context keys the documents' conditions read (``s3:prefix``, ``aws:ResourceTag/<key>``,
``cloudwatch:namespace``, ``ec2:osuser``).

moto authorises a call before it looks for the operation, so a call it authorises but does not
implement (StartInstanceRefresh, CompleteLifecycleAction, GetDownloadUrlForLayer in moto 5.2) is
logged here, then answered with an error. The tests
evaluate it against the unwidened documents with an IAM simulator that does evaluate conditions
(``tests/e2e/test_task_actors.py``, ``tools/iam-simulate/``).

The first calls moto lets through unsigned (the admin user's creation) are not checked, so not
logged. A call moto refuses is not logged either: the task that made it fails on the spot.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote
from xml.etree import ElementTree

_lock = threading.Lock()
_checked = threading.local()  # the IAM request moto has just allowed, per server thread


def read(path: Path) -> list[dict[str, Any]]:
    """The calls in a log, oldest first; none where no log was written."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- what AWS would evaluate --------------------------------------------------------------------


def _s3_checks(response: Any, resource: str) -> list[dict[str, Any]]:
    """IAM's action(s), resource(s) and context of one S3 request (moto's names differ in places)."""
    method = response.method.upper()
    query = {k: v[0] if isinstance(v, list) and v else v for k, v in (response.querystring or {}).items()}
    path = resource.split(":::", 1)[1]
    bucket, _, key = path.partition("/")
    bucket_arn = f"arn:aws:s3:::{bucket}"
    if not key:
        if method == "HEAD":
            # HeadBucket: authorised as s3:ListBucket, with no s3:prefix in the request.
            return [{"action": "s3:ListBucket", "resource": bucket_arn, "context": {}}]
        if method == "GET":
            context = {"s3:prefix": query["prefix"]} if "prefix" in query else {}
            if "versions" in query:
                return [{"action": "s3:ListBucketVersions", "resource": bucket_arn, "context": context}]
            if "uploads" in query:
                return [{"action": "s3:ListBucketMultipartUploads", "resource": bucket_arn, "context": {}}]
            if "versioning" in query:
                return [{"action": "s3:GetBucketVersioning", "resource": bucket_arn, "context": {}}]
            if "location" in query:
                return [{"action": "s3:GetBucketLocation", "resource": bucket_arn, "context": {}}]
            return [{"action": "s3:ListBucket", "resource": bucket_arn, "context": context}]
        if method == "POST" and "delete" in query:
            # DeleteObjects is authorised key by key, as a DeleteObject (or DeleteObjectVersion) of each.
            checks = []
            root = ElementTree.fromstring(response.body or b"<Delete/>")
            for obj in root.iter():
                if not obj.tag.endswith("Object"):
                    continue
                fields = {child.tag.rsplit("}", 1)[-1]: child.text or "" for child in obj}
                action = "s3:DeleteObjectVersion" if fields.get("VersionId") else "s3:DeleteObject"
                checks.append({"action": action, "resource": f"{bucket_arn}/{fields['Key']}", "context": {}})
            return checks
        if method == "PUT" and "versioning" in query:
            return [{"action": "s3:PutBucketVersioning", "resource": bucket_arn, "context": {}}]
        if method == "PUT":
            return [{"action": "s3:CreateBucket", "resource": bucket_arn, "context": {}}]
        return [{"action": f"s3:{response._get_action()}", "resource": bucket_arn, "context": {}}]
    object_arn = f"{bucket_arn}/{unquote(key)}"
    versioned = "versionId" in query
    if method in ("GET", "HEAD"):
        if "uploadId" in query:
            action = "s3:ListMultipartUploadParts"
        elif "tagging" in query:
            action = "s3:GetObjectVersionTagging" if versioned else "s3:GetObjectTagging"
        else:
            action = "s3:GetObjectVersion" if versioned else "s3:GetObject"
    elif method in ("PUT", "POST"):
        action = "s3:PutObjectTagging" if "tagging" in query else "s3:PutObject"
    elif method == "DELETE":
        if "uploadId" in query:
            action = "s3:AbortMultipartUpload"
        else:
            action = "s3:DeleteObjectVersion" if versioned else "s3:DeleteObject"
    else:
        action = f"s3:{response._get_action()}"
    return [{"action": action, "resource": object_arn, "context": {}}]


def _tags_context(tags: dict[str, str]) -> dict[str, str]:
    return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}


def _group_check(response: Any, action: str) -> dict[str, Any]:
    """An action on an auto scaling group: its ARN and its tags, as IAM sees the group."""
    from moto.autoscaling.models import autoscaling_backends

    backend = autoscaling_backends[response.current_account][response.region]
    name = response._get_param("AutoScalingGroupName")
    if not name:
        instance = response._get_param("InstanceId")
        for group in backend.autoscaling_groups.values():
            if any(state.instance.id == instance for state in group.instance_states):
                name = group.name
    found = backend.autoscaling_groups.get(name or "")
    if found is None:
        return {"action": action, "resource": "*", "context": {}}
    tags = {t["Key"]: t["Value"] for t in found.tags}
    return {"action": action, "resource": found.arn, "context": _tags_context(tags)}


def _secret_arn(response: Any) -> str:
    from moto.secretsmanager.models import secretsmanager_backends

    secret_id = str(response._get_param("SecretId") or response._get_param("Name"))
    found = secretsmanager_backends[response.current_account][response.region].secrets.get(secret_id)
    if found is not None:
        return str(found.arn)
    return f"arn:aws:secretsmanager:{response.region}:{response.current_account}:secret:{secret_id}"


# Secrets Manager's calls that name no secret: IAM authorises them on "*".
UNNAMED_SECRET_CALLS = frozenset({"ListSecrets", "GetRandomPassword", "BatchGetSecretValue"})


def _secret_resource(response: Any) -> str:
    """The secret a Secrets Manager call acts on, by its ARN: what moto's access control then checks
    the caller's statements against, as AWS does."""
    if response._get_action() in UNNAMED_SECRET_CALLS:
        return "*"
    return _secret_arn(response)


def _key_arn(response: Any) -> str:
    """A KMS call's key as IAM sees it: the key's ARN, whether the call named it by id, ARN or alias."""
    from moto.kms.models import kms_backends

    backend = kms_backends[response.current_account][response.region]
    try:
        return str(backend.describe_key(str(response._get_param("KeyId"))).arn)
    except Exception:  # an unknown key: the call itself fails; IAM saw no key
        return "*"


def _instance_key_check(response: Any) -> dict[str, Any]:
    """SendSSHPublicKey: authorised on the instance (its ARN and tags) for the OS user named."""
    from moto.ec2.models import ec2_backends

    region, account = response.region, response.current_account
    instance = str(response._get_param("InstanceId"))
    found = ec2_backends[account][region].describe_tags(filters={"resource-id": [instance]})
    context = _tags_context({tag["key"]: tag["value"] for tag in found})
    context["ec2:osuser"] = str(response._get_param("InstanceOSUser"))
    return {
        "action": "ec2-instance-connect:SendSSHPublicKey",
        "resource": f"arn:aws:ec2:{region}:{account}:instance/{instance}",
        "context": context,
    }


GROUP_ACTIONS = frozenset(
    {
        "SetDesiredCapacity",
        "SetInstanceProtection",
        "SuspendProcesses",
        "ResumeProcesses",
        "TerminateInstanceInAutoScalingGroup",
        "UpdateAutoScalingGroup",
        "CompleteLifecycleAction",
        "RecordLifecycleActionHeartbeat",
        "StartInstanceRefresh",
        "CancelInstanceRefresh",
    }
)


def checks(service: str, response: Any, operation: str, resource: str) -> list[dict[str, Any]]:
    """What IAM evaluates for one call moto has allowed: action, resource and context, by service."""
    if service == "s3":
        return _s3_checks(response, resource)
    region, account = response.region, response.current_account
    if service == "monitoring":
        action = f"cloudwatch:{operation}"
        namespace = response._get_param("Namespace")
        context = {"cloudwatch:namespace": namespace} if operation == "PutMetricData" and namespace else {}
        return [{"action": action, "resource": "*", "context": context}]
    if service == "secretsmanager":
        return [
            {"action": f"secretsmanager:{operation}", "resource": _secret_resource(response), "context": {}}
        ]
    if service == "autoscaling" and operation in GROUP_ACTIONS:
        return [_group_check(response, f"autoscaling:{operation}")]
    if service == "elasticloadbalancing" and operation in ("RegisterTargets", "DeregisterTargets"):
        arn = response._get_param("TargetGroupArn") or "*"
        return [{"action": f"elasticloadbalancing:{operation}", "resource": arn, "context": {}}]
    if service == "ssm" and operation in ("GetParameter", "GetParameters", "PutParameter"):
        name = str(response._get_param("Name") or "").lstrip("/")
        return [
            {
                "action": f"ssm:{operation}",
                "resource": f"arn:aws:ssm:{region}::parameter/{name}",
                "context": {},
            }
        ]
    if service == "ecr" and operation != "GetAuthorizationToken":
        # Every ECR call but the registry login acts on one repository (the login reads nothing).
        name = response._get_param("repositoryName")
        arn = f"arn:aws:ecr:{region}:{account}:repository/{name}" if name else "*"
        return [{"action": f"ecr:{operation}", "resource": arn, "context": {}}]
    if service == "sqs":
        # moto found the queue by its URL (the call's resource); GetQueueUrl names it by QueueName.
        name = response._get_param("QueueName")
        if not resource.startswith("arn:") and name:
            resource = f"arn:aws:sqs:{region}:{account}:{name}"
        return [{"action": f"sqs:{operation}", "resource": resource, "context": {}}]
    if service == "kms" and response._get_param("KeyId"):
        return [{"action": f"kms:{operation}", "resource": _key_arn(response), "context": {}}]
    if service == "ec2-instance-connect" and operation == "SendSSHPublicKey":
        return [_instance_key_check(response)]
    if service == "logs" and operation in ("CreateLogStream", "PutLogEvents", "DescribeLogStreams"):
        group = response._get_param("logGroupName")
        arn = f"arn:aws:logs:{region}:{account}:log-group:{group}"
        stream = response._get_param("logStreamName")
        return [
            {
                "action": f"logs:{operation}",
                "resource": f"{arn}:log-stream:{stream}" if stream else arn,
                "context": {},
            }
        ]
    return [{"action": f"{service}:{operation}", "resource": "*", "context": {}}]


# --- the patch ----------------------------------------------------------------------------------


def install(log: Path) -> None:
    """Make moto's access control check a Secrets Manager call on its secret and append each call it
    allows to ``log``."""
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.iam.access_control import IAMRequestBase
    from moto.secretsmanager.responses import SecretsManagerResponse

    # moto's responses that define this are authorised on what it returns (moto/core/responses.py).
    SecretsManagerResponse._determine_resource = _secret_resource  # type: ignore[attr-defined]

    allow = IAMRequestBase.check_action_permitted
    authorize = ActionAuthenticatorMixin._authenticate_and_authorize_action

    def check_action_permitted(self: Any, resource: str) -> None:
        _checked.request = None
        allow(self, resource)
        _checked.request = self  # reached only when moto allowed the call

    def authenticate_and_authorize(self: Any, iam_request_cls: type, resource: str = "*") -> None:
        _checked.request = None
        authorize(self, iam_request_cls, resource)
        request = getattr(_checked, "request", None)
        _checked.request = None
        if request is None or request._action == "sts:GetCallerIdentity":
            return
        service, _, operation = request._action.partition(":")
        try:
            found = checks(service, self, operation, resource)
        except Exception as exc:  # noqa: BLE001 - a call the log cannot describe is logged as such
            found = [{"action": request._action, "resource": resource, "context": {}, "error": repr(exc)}]
        lines = "".join(
            json.dumps({"principal": request._access_key.arn, "operation": operation, **check}) + "\n"
            for check in found
        )
        with _lock, log.open("a") as out:
            out.write(lines)

    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]
    ActionAuthenticatorMixin._authenticate_and_authorize_action = authenticate_and_authorize  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--log":
        raise SystemExit(
            "usage: python -m frontier.targets.local.moto_calls --log FILE [moto.server arguments]"
        )
    install(Path(argv[1]))
    from moto.server import main as serve

    serve(argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
