"""What the targets Pulumi provisions on AWS (EC2, Kubernetes) answer alike.

Both read a stack they did not build: what ``pulumi up`` exported, saved for ``fab``
(:func:`frontier.aws.stack_outputs`), names the history bucket and the endpoint, and AWS holds the
pool's API keys. Each target's backend derives from :class:`AwsTarget` in its own room and adds
how it reaches its hosts or pods, how it rolls, and which of the outputs' models it reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from frontier_runtime.storage.secrets import parse_keys

from frontier import aws
from frontier.config.outputs import StackOutputs
from frontier.release.history import HistoryStore, stack_history
from frontier.rollout.target import PoolTarget


class AwsTarget(PoolTarget, ABC):
    """A stack's target on AWS, acting for one of its pools."""

    @abstractmethod
    def outputs(self) -> StackOutputs[str]:
        """What ``pulumi up`` of the stack exported, as saved for ``fab``: each target reads its own model."""

    def aws_client(self, service: str) -> Any:
        return aws.client(self.settings, service)

    def history_store(self) -> HistoryStore:
        outputs = self.outputs()
        return stack_history(
            self.settings,
            self.pool.name,
            self.aws_client("s3"),
            outputs.history_bucket,
            outputs.history_prefix,
        )

    def endpoint(self) -> str:
        return self.outputs().endpoint

    def api_key(self) -> str | None:
        return None

    def api_keys_rotated(self, secret_id: str) -> str | None:
        return None  # clients and the gateway read the secret itself

    def runtime_key(self) -> str | None:
        """The pool's runtimes' API key (the first of its own secret), for the canary's verification,
        which reaches one runtime directly: through its host's SSH connection, or a port-forward
        stream to its pod."""
        secret_id = self.pool.runtime.api_keys_secret
        if not secret_id:
            return None
        value = self.aws_client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"]
        return parse_keys(value, secret_id)[0]  # the runtime's own reading of the secret
