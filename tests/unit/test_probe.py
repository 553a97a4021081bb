"""The synthetic probe: its fixed request against a real HTTP server (a stand-in for the public
endpoint), and each target's way of running it: the EC2 Lambda's handler with moto for Secrets
Manager and CloudWatch, the Kubernetes CronJob's command in a fresh interpreter, the local stack's
watch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from frontier_hostside import probe
from moto import mock_aws

from frontier.alarms import PROBE_FAILED_MINUTES
from frontier.targets.local.alarms import ProbeWatch
from infra.functions import synthetic_probe

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-probe-test"


class Endpoint(BaseHTTPRequestHandler):
    """The public endpoint: a completion for a request with the key, 401 without; ``mode`` breaks it."""

    mode = "ok"
    seen: list[dict] = []
    keys: frozenset[str] = frozenset({KEY})  # the keys it accepts

    def log_message(self, *_args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Endpoint.seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.headers.get("Authorization") not in {f"Bearer {key}" for key in Endpoint.keys}:
            self._answer(401, {"error": {"message": "invalid API key"}})
        elif self.mode == "slow":
            time.sleep(1.0)
            self._answer(200, {"choices": [{"text": "ok"}]})
        elif self.mode == "empty":
            self._answer(200, {"choices": []})
        elif self.mode == "overloaded":
            self._answer(503, {"error": {"message": "no replica ready"}})
        else:
            self._answer(200, {"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def endpoint(mode: str = "ok") -> Iterator[str]:
    Endpoint.mode, Endpoint.seen, Endpoint.keys = mode, [], frozenset({KEY})
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_sends_one_fixed_greedy_token_per_model_and_succeeds_on_a_choice():
    with endpoint() as url:
        result = probe.probe(url, ["llama", "qwen"], KEY)
    assert result.ok and result.status == 200 and result.latency_ms > 0
    assert [s["body"]["model"] for s in Endpoint.seen] == ["llama", "qwen"]
    assert all(s["path"] == probe.PROBE_PATH for s in Endpoint.seen)
    first = Endpoint.seen[0]["body"]
    assert (first["prompt"], first["max_tokens"], first["temperature"]) == (probe.PROBE_PROMPT, 1, 0)


@pytest.mark.parametrize(
    ("mode", "key", "status", "why"),
    [
        ("ok", "sk-wrong", 401, "HTTP 401"),
        ("overloaded", KEY, 503, "HTTP 503"),
        ("empty", KEY, 200, "no choice"),
    ],
)
def test_the_probe_fails_on_any_answer_but_a_completion(mode, key, status, why):
    with endpoint(mode) as url:
        result = probe.probe(url, ["llama"], key)
    assert not result.ok and result.status == status and why in result.error and result.model == "llama"


def test_a_probe_past_its_timeout_fails_without_an_answer():
    with endpoint("slow") as url:
        result = probe.probe(url, ["llama"], KEY, timeout_s=0.2)
    assert not result.ok and result.status == 0 and "timed out" in result.error


def test_an_endpoint_that_refuses_connections_fails_the_probe():
    with endpoint() as url:
        pass  # closed again: nothing listens there now
    result = probe.probe(url, ["llama"], KEY, timeout_s=2)
    assert not result.ok and result.status == 0 and "Connection" in result.error


def test_the_probe_key_is_the_first_of_the_runtimes_key_set_or_a_plain_key():
    assert probe.key_from_secret('{"keys": ["new", "old"]}') == "new"
    assert probe.key_from_secret("sk-plain\n") == "sk-plain"
    with pytest.raises(ValueError, match="neither"):
        probe.key_from_secret('{"other": 1}')


def test_the_lambda_reads_its_key_probes_and_publishes_success_and_latency(monkeypatch):
    with mock_aws(), endpoint() as url:
        boto3.client("secretsmanager", region_name="us-east-1").create_secret(
            Name="frontier/dev/api-keys", SecretString=json.dumps({"keys": [KEY, "sk-old"]})
        )
        for name, value in {
            probe.ENDPOINT_ENV: url,
            probe.MODELS_ENV: "llama",
            probe.STACK_ENV: "dev",
            probe.KEY_SECRET_ENV: "frontier/dev/api-keys",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv(probe.KEY_ENV, raising=False)
        answer = synthetic_probe.handler({"source": "aws.events"}, None)
        cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
        metrics = cloudwatch.list_metrics(Namespace="Frontier/Runtime")["Metrics"]
    assert answer["ok"] is True and Endpoint.seen[0]["auth"] == f"Bearer {KEY}"
    assert {(m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) for m in metrics} == {
        ("ProbeSuccess", (("Stack", "dev"),)),
        ("ProbeLatency", (("Stack", "dev"),)),
    }


def test_the_lambda_asks_each_model_with_the_first_key_of_its_own_pools_secret(monkeypatch):
    with mock_aws(), endpoint() as url:
        Endpoint.keys = frozenset({KEY, "sk-small"})
        client = boto3.client("secretsmanager", region_name="us-east-1")
        client.create_secret(Name="frontier/dev/llama/api-keys", SecretString=json.dumps({"keys": [KEY]}))
        client.create_secret(
            Name="frontier/dev/small/api-keys", SecretString=json.dumps({"keys": ["sk-small"]})
        )
        for name, value in {
            probe.ENDPOINT_ENV: url,
            probe.MODELS_ENV: "llama,small",
            probe.STACK_ENV: "dev",
            probe.KEY_SECRET_ENV: "frontier/dev/llama/api-keys,frontier/dev/small/api-keys",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv(probe.KEY_ENV, raising=False)
        answer = synthetic_probe.handler({"source": "aws.events"}, None)
    assert answer["ok"] is True
    assert {seen["body"]["model"]: seen["auth"] for seen in Endpoint.seen} == {
        "llama": f"Bearer {KEY}",
        "small": "Bearer sk-small",
    }


def test_key_secrets_name_one_secret_for_every_model_or_one_per_model():
    models = ["a", "b"]
    assert probe.key_secrets({probe.KEY_SECRET_ENV: "s"}, models) == {"a": "s", "b": "s"}
    assert probe.key_secrets({probe.KEY_SECRET_ENV: "s1,s2"}, models) == {"a": "s1", "b": "s2"}
    assert probe.key_secrets({}, models) == {}
    with pytest.raises(ValueError, match="names 3 secrets for 2 models"):
        probe.key_secrets({probe.KEY_SECRET_ENV: "s1,s2,s3"}, models)


def test_a_failed_probe_is_published_as_zero_not_raised(monkeypatch):
    with mock_aws(), endpoint("overloaded") as url:
        for name, value in {
            probe.ENDPOINT_ENV: url,
            probe.MODELS_ENV: "llama",
            probe.STACK_ENV: "dev",
            probe.KEY_ENV: KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        answer = synthetic_probe.handler({}, None)
        stats = boto3.client("cloudwatch", region_name="us-east-1").get_metric_statistics(
            Namespace="Frontier/Runtime",
            MetricName="ProbeSuccess",
            Dimensions=[{"Name": "Stack", "Value": "dev"}],
            StartTime="2000-01-01T00:00:00Z",
            EndTime="2100-01-01T00:00:00Z",
            Period=60,
            Statistics=["Maximum"],
        )["Datapoints"]
    assert answer["ok"] is False and answer["status"] == 503
    assert [d["Maximum"] for d in stats] == [0.0]


def cron_job_command(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CronJob's command as the runtime's image runs it: a fresh interpreter, its environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRONTIER_PROBE_")}
    return subprocess.run(
        [sys.executable, "-m", "frontier_runtime.probe"],
        env={**base, probe.ENDPOINT_ENV: url, probe.MODELS_ENV: "llama", probe.STACK_ENV: "eks", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_the_cron_jobs_command_exits_0_on_success_and_1_on_failure_with_one_json_line():
    with endpoint() as url:
        passed = cron_job_command(url, **{probe.KEY_ENV: KEY})
        refused = cron_job_command(url, **{probe.KEY_ENV: "sk-wrong"})
    assert passed.returncode == 0, passed.stderr
    assert json.loads(passed.stdout)["ok"] is True
    assert refused.returncode == 1 and json.loads(refused.stdout)["status"] == 401


def test_the_cron_jobs_command_without_its_settings_exits_2_naming_them():
    done = subprocess.run(
        [sys.executable, "-m", "frontier_runtime.probe"],
        env={k: v for k, v in os.environ.items() if not k.startswith("FRONTIER_PROBE_")},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2 and probe.ENDPOINT_ENV in json.loads(done.stdout)["error"]


def test_the_local_probe_watch_fires_after_the_declared_failed_minutes_and_clears_on_success():
    watch = ProbeWatch("page")
    failed = probe.ProbeResult(False, 5.0, "llama", 503, "HTTP 503: no replica ready")
    assert watch.due(0.0)
    fired = None
    for minute in range(PROBE_FAILED_MINUTES):
        assert fired is None
        fired = watch.observe(failed, 60.0 * minute)
    assert fired is not None and (fired.alarm, fired.new, fired.severity) == (
        "probe-failing",
        "ALARM",
        "page",
    )
    assert "HTTP 503" in fired.reason
    assert not watch.due(60.0 * PROBE_FAILED_MINUTES - 61) and watch.due(60.0 * PROBE_FAILED_MINUTES)
    assert watch.observe(failed, 60.0 * PROBE_FAILED_MINUTES) is None  # once, not every minute
    cleared = watch.observe(probe.ProbeResult(True, 12.0, "llama", 200), 60.0 * (PROBE_FAILED_MINUTES + 1))
    assert cleared is not None and (cleared.old, cleared.new) == ("ALARM", "OK")
