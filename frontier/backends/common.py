"""What every backend does the same way, given its hosts, connections and AWS clients."""

from __future__ import annotations

from typing import Any

from frontier import aws
from frontier.config.schema import Settings
from frontier.fleet.host import HostSession
from frontier.fleet.inventory import HostSpec, ssh_connection
from frontier.release.history import HistoryStore


class BackendBase:
    kind = "base"
    creates_buckets = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def aws_client(self, service: str) -> Any:
        return aws.client(self.settings, service)

    def connect(self, host: HostSpec) -> Any:
        return ssh_connection(self.settings, host)

    def session(self, host: HostSpec) -> HostSession:
        return HostSession(self.settings, host, self.connect(host))

    def _history(self, bucket: str, prefix: str) -> HistoryStore:
        return HistoryStore(self.aws_client("s3"), bucket, self.settings.stack, prefix)
