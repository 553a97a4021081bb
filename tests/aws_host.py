"""What the tests of a host's AWS paths share: the AWS CLI a host calls, a parameter AWS publishes put
into moto's store, and a runtime's /metrics page for the host's publisher to scrape."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from http.server import BaseHTTPRequestHandler

from frontier_hostside.names import RUNNING_METRIC, WAITING_METRIC


def find_aws_cli() -> str | None:
    """The aws command (None where none is on PATH); behind a pyenv shim, the real one (each shim
    hop costs half a second)."""
    found = shutil.which("aws")
    if found and "/.pyenv/shims/" in found:
        done = subprocess.run(["pyenv", "which", "aws"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return found


def aws_cli(needed_for: str = "hosts bootstrap through it") -> str:
    """The aws command, which must be on PATH: ``needed_for`` says why."""
    found = find_aws_cli()
    assert found, f"the AWS CLI (`aws`) must be on PATH: {needed_for}"
    return found


def publish_parameter(name: str, value: str, region: str) -> None:
    """A parameter AWS publishes (``/aws/service/...``). moto refuses puts there (as AWS does), so the
    value goes into moto's store the way moto loads its own published parameters."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    versions = ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters[name]
    versions.append(
        Parameter(
            account_id=DEFAULT_ACCOUNT_ID,
            name=name,
            value=value,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=datetime.datetime.now(datetime.UTC),
            version=len(versions) + 1,
            data_type="text",
        )
    )


class MetricsPage(BaseHTTPRequestHandler):
    """A runtime's /metrics, as the publisher scrapes it: ``body`` (a subclass sets its own)."""

    body = f"{WAITING_METRIC} 2\n{RUNNING_METRIC} 1\n".encode()

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)
