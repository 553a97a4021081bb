"""AWS through its CLI, for the host bootstrap: one subprocess per call, its JSON answer read here.

The CLI, not boto3: the Deep Learning AMI ships it (cloud-init installs it on plain Ubuntu), it
takes the instance profile's credentials from IMDSv2 and honours ``AWS_ENDPOINT_URL`` (the local
stack's moto) like boto3 does, and it keeps the boot path free of a pip install from PyPI into a
venv before the host can serve. Standard library only, Python 3.8 and later: it travels beside
``frontier-bootstrap.py`` (``frontier_hostside.IMPORTED_FILES``).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BootError(Exception):
    """A step that keeps the host from serving; its message is the reason the hook is abandoned for."""


# Lifecycle states of a host that no longer holds its place in the group.
GONE_STATES = ("Terminating", "Terminated", "Detaching", "Detached")
DESCRIBE_INSTANCES_MAX = 50


@dataclass
class Aws:
    region: str
    command: str = "aws"
    calls: list[list[str]] = field(default_factory=list)
    bucket: str = ""  # the history bucket: where the rendezvous's slots live

    def run(self, *args: str) -> dict[str, Any]:
        argv = [self.command, "--region", self.region, "--output", "json", *args]
        self.calls.append(list(args))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise BootError(f"aws {' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()}")
        return json.loads(done.stdout) if done.stdout.strip() else {}

    def keys(self, bucket: str, prefix: str) -> list[str]:
        answer = self.run("s3api", "list-objects-v2", "--bucket", bucket, "--prefix", prefix)
        return sorted(item["Key"] for item in answer.get("Contents") or [])

    def get(self, bucket: str, key: str, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        self.run("s3api", "get-object", "--bucket", bucket, "--key", key, str(target))
        return target

    def copy_prefix(self, bucket: str, prefix: str, target: Path) -> Path:
        """Every object under ``prefix`` into ``target`` (one CLI call: each costs a second or two)."""
        target.mkdir(parents=True, exist_ok=True)
        self.run("s3", "cp", "--quiet", "--recursive", f"s3://{bucket}/{prefix}", str(target))
        return target

    def put(self, bucket: str, key: str, body: bytes) -> None:
        with tempfile.NamedTemporaryFile(suffix=".json") as fh:
            fh.write(body)
            fh.flush()
            self.run("s3api", "put-object", "--bucket", bucket, "--key", key, "--body", fh.name)

    # The rendezvous's slots (frontier_hostside.rendezvous.Slots): S3's conditional writes, which
    # the CLI passes on as If-None-Match / If-Match; a condition that does not hold is a 412.

    def list_keys(self, prefix: str) -> list[str]:
        return self.keys(self.bucket, prefix)

    def read(self, key: str) -> tuple[bytes, str] | None:
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "object"
            try:
                answer = self.run("s3api", "get-object", "--bucket", self.bucket, "--key", key, str(target))
            except BootError as exc:
                if "NoSuchKey" in str(exc):
                    return None
                raise
            return target.read_bytes(), str(answer["ETag"])

    def create(self, key: str, body: bytes) -> bool:
        return self._put_if(key, body, "--if-none-match", "*")

    def replace(self, key: str, body: bytes, etag: str) -> bool:
        return self._put_if(key, body, "--if-match", etag)

    def _put_if(self, key: str, body: bytes, condition: str, value: str) -> bool:
        with tempfile.NamedTemporaryFile(suffix=".json") as fh:
            fh.write(body)
            fh.flush()
            try:
                self.run(
                    "s3api", "put-object", "--bucket", self.bucket, "--key", key, "--body", fh.name,
                    condition, value,
                )  # fmt: skip
            except BootError as exc:
                # 409 ConditionalRequestConflict: another conditional write to the key is in flight.
                if "PreconditionFailed" in str(exc) or "ConditionalRequestConflict" in str(exc):
                    return False
                raise
        return True

    def live(self, instance_ids: list[str]) -> set[str]:
        """The ids that are members of an auto scaling group and not on their way out of it."""
        live: set[str] = set()
        for start in range(0, len(instance_ids), DESCRIBE_INSTANCES_MAX):  # the call's own limit
            chunk = instance_ids[start : start + DESCRIBE_INSTANCES_MAX]
            answer = self.run("autoscaling", "describe-auto-scaling-instances", "--instance-ids", *chunk)
            live |= {
                found["InstanceId"]
                for found in answer.get("AutoScalingInstances") or []
                if not found["LifecycleState"].startswith(GONE_STATES)
            }
        return live

    def group_of(self, instance_id: str) -> tuple[str, str]:
        """(auto scaling group, lifecycle state) of an instance; ("", "") outside any group."""
        answer = self.run("autoscaling", "describe-auto-scaling-instances", "--instance-ids", instance_id)
        found = answer.get("AutoScalingInstances") or []
        if not found:
            return "", ""
        return found[0]["AutoScalingGroupName"], found[0]["LifecycleState"]

    def complete(self, group: str, hook: str, instance_id: str, result: str) -> None:
        self.run(
            "autoscaling", "complete-lifecycle-action", "--auto-scaling-group-name", group,
            "--lifecycle-hook-name", hook, "--instance-id", instance_id, "--lifecycle-action-result", result,
        )  # fmt: skip

    def put_metrics(self, namespace: str, data: list[dict[str, Any]]) -> None:
        self.run("cloudwatch", "put-metric-data", "--namespace", namespace, "--metric-data", json.dumps(data))
