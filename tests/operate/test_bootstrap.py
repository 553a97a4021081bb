"""The host bootstrap, run for real: the AWS CLI against moto's server, the host agent, a runtime.

A host that boots reads the stack's current good release from the history bucket, verifies it,
stages and starts it with the host agent and waits until it is ready; then it completes the launch
lifecycle hook. The runtime is ``runtime_standin.py`` packed into a wheel as ``frontier_runtime``
(a real process answering the health paths over HTTP). The AWS calls go through the real ``aws``
command to moto, except the two that moto does not implement: the lifecycle state of an instance
(moto's instances are InService at once, never Pending:Wait or Terminating:Wait) and
CompleteLifecycleAction. :class:`HookedAws` answers and records exactly those two.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
import urllib.request
import zipfile
from dataclasses import replace
from http.server import ThreadingHTTPServer
from pathlib import Path

import boto3
import frontier_hostside
import pytest
from frontier_hostside import bootstrap, node_boot
from frontier_hostside.aws_cli import Aws
from frontier_hostside.names import (
    E2E_LATENCY_METRIC,
    KV_USAGE_METRIC,
    READY_METRIC,
    REQUEST_FAILURES_METRIC,
    RUNNING_METRIC,
    STRUCTURED_OUTPUT_INVALID,
    STRUCTURED_OUTPUTS_METRIC,
    TTFT_METRIC,
    UNIT_NAME,
    WAITING_METRIC,
)
from frontier_hostside.node_boot import NodeConfig

from frontier.alarms import NAMED_ALARMS
from frontier.hosts.boots import boot_records
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, iso, now
from frontier.release.release import Release
from frontier.render.boot import node_env
from frontier.render.host import render_agent_config
from frontier.targets import load_stack
from frontier.targets.local import services
from tests.aws_host import MetricsPage, find_aws_cli

# Each AWS CLI call costs a second or two here: the boots take 15-30 s.
pytestmark = pytest.mark.slow

STANDIN = Path(__file__).with_name("runtime_standin.py")
BUCKET = "frontier-local-history-123456789012-us-east-1"


AWS_CLI = find_aws_cli()


class HookedAws(Aws):
    """The real CLI, except the lifecycle calls moto lacks (see the module docstring)."""

    def __init__(self, region: str, state: str) -> None:
        super().__init__(region, command=AWS_CLI or "aws")
        self.state = state
        self.completed: list[tuple[str, str, str, str]] = []

    def group_of(self, instance_id: str) -> tuple[str, str]:
        group, _ = super().group_of(instance_id)  # the group is moto's answer
        return group, self.state

    def complete(self, group: str, hook: str, instance_id: str, result: str) -> None:
        self.completed.append((group, hook, instance_id, result))


def standin_wheel(folder: Path) -> Path:
    """A wheel whose ``frontier_runtime`` package is the stand-in runtime."""
    name = "frontier_runtime_standin-0.0.1-py3-none-any.whl"
    path = folder / name
    files = {
        "frontier_runtime/__init__.py": b"",
        "frontier_runtime/__main__.py": STANDIN.read_bytes(),
        "frontier_runtime_standin-0.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: frontier-runtime-standin\nVersion: 0.0.1\n",
        "frontier_runtime_standin-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for rel, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(data)}")
    record.append("frontier_runtime_standin-0.0.1.dist-info/RECORD,,")
    files["frontier_runtime_standin-0.0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as wheel:
        for rel, data in files.items():
            wheel.writestr(zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """moto's server as AWS, an auto scaling group with one instance, the history with one release."""
    assert AWS_CLI, "the AWS CLI (`aws`) must be on PATH: hosts bootstrap through it"
    moto = services.start_moto(0, tmp_path / "moto", in_process=True)
    # In-process servers share moto's state: start from an empty account.
    urllib.request.urlopen(
        urllib.request.Request(f"{moto.endpoint}/moto-api/reset", method="POST"), timeout=10
    )
    for key, value in {
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    template = ec2.create_launch_template(
        LaunchTemplateName="lt", LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "g5.xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="frontier-local-asg",
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=1,
        MaxSize=2,
        DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )
    [instance] = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]

    settings = load_stack("local")
    port = services.free_port()
    root = tmp_path / "host"
    env = dict(
        node_env(settings, settings.serving_group, history_bucket=BUCKET, history_prefix="history/local/")
    )
    env |= {
        "AWS_REGION": "us-east-1",
        "FRONTIER_ROOT": str(root),
        "FRONTIER_READINESS_TIMEOUT_S": "30",
        "FRONTIER_INSTANCE_ID": instance["InstanceId"],
        "FRONTIER_ADDRESS": "127.0.0.1",
    }
    env_file = tmp_path / "node.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    agent_config = json.loads(
        render_agent_config(
            settings,
            settings.only_pool,
            host="bootstrap",
            root="/opt/frontier",
            python="/usr/bin/python3",
            address="0.0.0.0",
        )
    )
    agent_config["port"] = port
    tools = f"history/local/host/{settings.serving_group.name}/"
    for name, body in frontier_hostside.agent_files().items():
        s3.put_object(Bucket=BUCKET, Key=tools + name, Body=body)
    s3.put_object(Bucket=BUCKET, Key=tools + "frontier-agent.json", Body=json.dumps(agent_config).encode())

    store = HistoryStore(s3, BUCKET, "local", "history/local/")
    wheel = standin_wheel(tmp_path)
    artifact = Artifact(
        "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest(), "wheel", filename=wheel.name
    )
    store.put_artifact(artifact, wheel)
    runtime = {
        "readiness_path": settings.health.readiness_path,
        "liveness_path": settings.health.liveness_path,
    }
    release = Release(artifact, {"runtime.yaml": json.dumps(runtime) + "\n", UNIT_NAME: "[Unit]\n"})
    store.put_release(release)
    store.append({"kind": "deploy", "started_at": iso(now()), "release": release.id, "outcome": "succeeded"})
    config = replace(NodeConfig.load(str(env_file)))
    yield config, store, release, port, env_file, instance["InstanceId"]
    stop = subprocess.run(
        [
            sys.executable,
            str(root / "bin" / "frontier-agent.py"),
            "--config",
            str(root / "bin" / "frontier-agent.json"),
            "stop",
        ],
        capture_output=True,
        text=True,
    )
    assert stop.returncode in (0, 2), stop.stdout
    services.stop(moto)


def boots(store: HistoryStore) -> list[dict]:
    keys = store._keys("boots/")
    return [json.loads(store._get(key)) for key in keys]


def test_a_launching_host_serves_the_current_release_then_continues_its_launch_hook(cloud):
    config, store, release, port, _, instance_id = cloud
    aws = HookedAws(config.region, "Pending:Wait")
    answer = node_boot.boot(config, aws)
    assert answer["ok"] is True, answer
    assert (answer["outcome"], answer["release"]) == ("continued", release.id)
    # Ready before the hook is completed: the host joins the target group serving.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=5) as ready:
        assert ready.status == 200
    assert aws.completed == [("frontier-local-asg", "frontier-launch", instance_id, "CONTINUE")]
    [record] = boots(store)
    assert (record["outcome"], record["release"], record["host"]) == ("continued", release.id, instance_id)
    facts = node_boot.agent(config, "status")
    assert facts["current"] == release.id and facts["ready"] is True
    # The real CLI did the rest: the record listing, the release, the wheel, the boot record.
    assert ["s3api", "list-objects-v2"] in [call[:2] for call in aws.calls]


def test_a_release_altered_in_the_bucket_is_abandoned_with_the_reason(cloud):
    config, store, release, *_ = cloud
    store.s3.put_object(
        Bucket=BUCKET,
        Key=f"history/local/releases/{release.id}/files/runtime.yaml",
        Body=b'{"mode": "serve"}\n',
    )
    aws = HookedAws(config.region, "Pending:Wait")
    answer = node_boot.boot(config, aws)
    assert answer["ok"] is False and answer["outcome"] == "abandoned"
    assert "runtime.yaml has sha256" in answer["reason"] and "release.json says" in answer["reason"]
    assert [c[-1] for c in aws.completed] == ["ABANDON"]
    [record] = boots(store)
    assert record["outcome"] == "abandoned" and "runtime.yaml has sha256" in record["reason"]
    # What `fab history` lists beside the deploy records.
    [listed] = boot_records(store)
    assert (listed.outcome, listed.release, listed.host) == ("abandoned", release.id, record["host"])


def test_the_newest_good_record_wins_and_failed_ones_are_skipped(cloud):
    config, store, release, *_ = cloud
    store.append(
        {"kind": "deploy", "started_at": iso(now()), "release": "r-000000000000", "outcome": "rolled_back"}
    )
    record = node_boot.current_release(Aws(config.region, command=AWS_CLI or "aws"), config)
    assert record is not None and record["release"] == release.id == store.last_good()["release"]


class Metrics(MetricsPage):
    body = b""


def exposition(waiting: float, running: float, buckets: dict[str, float]) -> bytes:
    lines = [
        f'{WAITING_METRIC}{{model_name="m"}} {waiting}',
        f'{RUNNING_METRIC}{{model_name="m"}} {running}',
        *(f'{E2E_LATENCY_METRIC}_bucket{{le="{le}",model_name="m"}} {n}' for le, n in buckets.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def test_queue_depth_running_requests_and_latency_reach_cloudwatch(cloud):
    config, *_ = cloud
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = replace(config, metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics")
    try:
        Metrics.body = exposition(7, 3, {"0.5": 2, "1.0": 5, "+Inf": 5})
        first = node_boot.publish(config, Aws(config.region, command=AWS_CLI or "aws"))
        Metrics.body = exposition(9, 4, {"0.5": 2, "1.0": 6, "+Inf": 8})
        second = node_boot.publish(config, Aws(config.region, command=AWS_CLI or "aws"))
    finally:
        server.shutdown()
    assert (first["queue_depth"], first["running"], first["latency_requests"]) == (7, 3, 5)
    # Only what finished since the last scrape: 1 more under 1 s, 2 beyond the last bound.
    assert second["latency_requests"] == 3
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    dims = [{"Name": "Stack", "Value": "local"}, {"Name": "NodeGroup", "Value": config.node_group}]
    found = cloudwatch.list_metrics(Namespace="Frontier/Runtime")["Metrics"]
    names = {
        m["MetricName"]
        for m in found
        if sorted(m["Dimensions"], key=lambda d: d["Name"]) == sorted(dims, key=lambda d: d["Name"])
    }
    assert names == {
        "QueueDepth",
        "RunningRequests",
        "EndToEndLatency",
        "RuntimeRestarts",
        "RuntimeUp",
        "StructuredOutputs",
        "StructuredOutputFailures",
    }
    stats = cloudwatch.get_metric_statistics(
        Namespace="Frontier/Runtime",
        MetricName="QueueDepth",
        Dimensions=dims,
        StartTime=now().replace(year=2000),
        EndTime=now().replace(year=2100),
        Period=60,
        Statistics=["Maximum", "SampleCount"],
    )["Datapoints"]
    assert max(d["Maximum"] for d in stats) == 9 and sum(d["SampleCount"] for d in stats) == 2


def named_alarm_exposition(kv: float, checked: float, failed: float, ttft: dict[str, float]) -> bytes:
    """A runtime's /metrics with every series the named alarms read, as the runtime exports them."""
    lines = [
        f'{WAITING_METRIC}{{model_name="m"}} 0',
        f'{RUNNING_METRIC}{{model_name="m"}} 1',
        f"{READY_METRIC} 1",
        f'{KV_USAGE_METRIC}{{model_name="m"}} {kv}',
        f"{STRUCTURED_OUTPUTS_METRIC}_total {checked}",
        f'{REQUEST_FAILURES_METRIC}_total{{reason="{STRUCTURED_OUTPUT_INVALID}"}} {failed}',
        f'{REQUEST_FAILURES_METRIC}_total{{reason="queue_full"}} 40',
        *(f'{TTFT_METRIC}_bucket{{le="{le}",model_name="m"}} {n}' for le, n in ttft.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def published_values(cloudwatch, metric: str, dims: list[dict[str, str]], stat: str) -> list[float]:
    stats = cloudwatch.get_metric_statistics(
        Namespace="Frontier/Runtime",
        MetricName=metric,
        Dimensions=dims,
        StartTime=now().replace(year=2000),
        EndTime=now().replace(year=2100),
        Period=60,
        Statistics=[stat],
    )["Datapoints"]
    return [d[stat] for d in stats]


def test_every_series_the_named_alarms_read_on_ec2_is_published_by_the_host(cloud):
    config, *_ = cloud
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = replace(config, metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics")
    aws = Aws(config.region, command=AWS_CLI or "aws")
    try:
        Metrics.body = named_alarm_exposition(0.5, 10, 1, {"0.1": 3, "1.0": 4, "+Inf": 4})
        node_boot.publish(config, aws)
        Metrics.body = named_alarm_exposition(0.97, 30, 5, {"0.1": 5, "1.0": 8, "+Inf": 9})
        second = node_boot.publish(config, aws)
    finally:
        server.shutdown()
    # What happened since the first publish: 20 outputs checked, 4 failed; 5 first tokens.
    assert (second["structured_checked"], second["structured_failed"], second["ttft_requests"]) == (20, 4, 5)
    assert second["ready"] is True and second["kv_usage"] == 0.97
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    dims = [{"Name": "Stack", "Value": config.stack}, {"Name": "NodeGroup", "Value": config.node_group}]
    published = {
        m["MetricName"]
        for m in cloudwatch.list_metrics(Namespace="Frontier/Runtime")["Metrics"]
        if sorted(m["Dimensions"], key=lambda d: d["Name"]) == sorted(dims, key=lambda d: d["Name"])
    }
    read = {
        metric
        for alarm in NAMED_ALARMS.values()
        if (condition := alarm.cloudwatch(load_stack("prod"))).per_node_group
        for metric in condition.read()
    }
    assert read == {
        "TimeToFirstToken",
        "KVCacheUsage",
        "StructuredOutputFailures",
        "StructuredOutputs",
        "RuntimeUp",
        "RuntimeRestarts",
    }
    assert read <= published
    assert published_values(cloudwatch, "KVCacheUsage", dims, "Maximum") == [0.97]
    # The first publish has no earlier count to subtract: it puts 0, the second the 4 since.
    assert published_values(cloudwatch, "StructuredOutputFailures", dims, "Sum") == [4]


def started_exposition(process_start: float, phases: dict[str, float]) -> bytes:
    """A ready runtime's /metrics with its start's phases, as the runtime exports them."""
    lines = [
        f"{READY_METRIC} 1",
        f"process_start_time_seconds {process_start}",
        *(f'frontier_start_phase_seconds{{phase="{p}"}} {s}' for p, s in phases.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def test_each_start_of_the_runtime_is_published_once_phase_by_phase(cloud):
    config, *_ = cloud
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = replace(config, metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics")
    aws = Aws(config.region, command=AWS_CLI or "aws")
    first = {"fetch": 41.5, "verify": 39.0, "load": 12.25, "warmup": 3.5, "ready": 58.0}
    second = {"fetch": 0.5, "verify": 0.0, "load": 9.0, "warmup": 3.0, "ready": 13.0}
    try:
        Metrics.body = started_exposition(1_700_000_000.0, first)
        published = [node_boot.publish(config, aws)["startup"], node_boot.publish(config, aws)["startup"]]
        Metrics.body = started_exposition(1_700_000_900.0, second)  # restarted: a new process
        published.append(node_boot.publish(config, aws)["startup"])
    finally:
        server.shutdown()
    assert published == [first, {}, second]  # the same start is not published twice
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    for phase in first:
        dims = [
            {"Name": "Stack", "Value": config.stack},
            {"Name": "NodeGroup", "Value": config.node_group},
            {"Name": "Phase", "Value": phase},
        ]
        values = published_values(cloudwatch, "StartupSeconds", dims, "Maximum")
        assert values == [max(first[phase], second[phase])], phase


def test_a_runtime_that_does_not_answer_long_after_its_host_booted_is_published_as_down(cloud):
    config, *_ = cloud
    config = replace(config, metrics_url=f"http://127.0.0.1:{services.free_port()}/metrics")
    # Never launched, on a host that booted long ago: no start explains the silence.
    answer = node_boot.publish(config, Aws(config.region, command=AWS_CLI or "aws"), booted_at=0.0)
    assert answer["ok"] is False and answer["ready"] is False and answer["down"] is True
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    dims = [{"Name": "Stack", "Value": config.stack}, {"Name": "NodeGroup", "Value": config.node_group}]
    assert published_values(cloudwatch, "RuntimeUp", dims, "Maximum") == [0.0]


def test_a_runtime_that_does_not_answer_just_after_its_launch_is_published_as_up(cloud):
    config, *_ = cloud
    config = replace(config, metrics_url=f"http://127.0.0.1:{services.free_port()}/metrics")
    run = Path(config.root) / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "runtime.pid").write_text("4242\n")  # what the agent writes as it launches the runtime
    answer = node_boot.publish(config, Aws(config.region, command=AWS_CLI or "aws"), booted_at=0.0)
    assert answer["down"] is False
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    dims = [{"Name": "Stack", "Value": config.stack}, {"Name": "NodeGroup", "Value": config.node_group}]
    assert published_values(cloudwatch, "RuntimeUp", dims, "Minimum") == [1.0]


def test_restarts_are_published_as_the_count_since_the_last_publish(cloud, monkeypatch):
    config, *_ = cloud
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = replace(config, metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics")
    counted = iter([1, 3, 3])  # what the agent's status reports at each publish
    monkeypatch.setattr(node_boot, "_restarts", lambda _config: next(counted))
    try:
        Metrics.body = exposition(0, 0, {"+Inf": 0})
        aws = Aws(config.region, command=AWS_CLI or "aws")
        published = [node_boot.publish(config, aws)["restarts"] for _ in range(3)]
    finally:
        server.shutdown()
    assert published == [0, 2, 0]


def test_latency_values_come_from_histogram_deltas_and_a_restart_starts_over():
    before = {0.5: 2.0, 1.0: 5.0, float("inf"): 5.0}
    assert node_boot.latency_values(before, {0.5: 3.0, 1.0: 7.0, float("inf"): 8.0}) == (
        [500.0, 1000.0, 1000.0],
        [1.0, 1.0, 1.0],
    )
    # A restarted runtime's counters are lower: everything it counted is new.
    assert node_boot.latency_values(before, {0.5: 1.0, 1.0: 1.0, float("inf"): 1.0}) == ([500.0], [1.0])


def test_scale_in_drains_the_runtime_before_the_terminate_hook_continues(cloud):
    config, store, release, port, _, instance_id = cloud
    assert node_boot.boot(config, HookedAws(config.region, "Pending:Wait"))["ok"]
    assert node_boot.drain_if_terminating(config, HookedAws(config.region, "InService")) is None
    aws = HookedAws(config.region, "Terminating:Wait")
    answer = node_boot.drain_if_terminating(config, aws)
    assert answer is not None and answer["reason"] == "drained"
    assert aws.completed == [("frontier-local-asg", "frontier-terminate", instance_id, "CONTINUE")]
    assert node_boot.agent(config, "facts")["running"] is False


def test_the_command_hosts_run_publishes_with_the_real_cli(cloud):
    *_, env_file, _ = cloud
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Metrics.body = exposition(1, 1, {"+Inf": 0})
    text = env_file.read_text()
    env_file.write_text(
        "\n".join(
            f"FRONTIER_METRICS_URL=http://127.0.0.1:{server.server_address[1]}/metrics"
            if line.startswith("FRONTIER_METRICS_URL=")
            else line
            for line in text.splitlines()
        )
    )
    try:
        done = subprocess.run(
            [sys.executable, bootstrap.__file__, "--env", str(env_file), "publish"],
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": f"{Path(AWS_CLI or 'aws').parent}:{os.environ['PATH']}"},
            timeout=120,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["queue_depth"] == 1
