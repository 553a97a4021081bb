"""A runtime host's bootstrap: boot, abandon, publish, watch, replica-env (see ``bootstrap.py``).

Configuration: ``KEY=VALUE`` lines of ``/etc/frontier/node.env``, rendered by Frontier from the
stack (see ``templates/cloud-init.yaml.j2``). Standard library only, Python 3.8 and later: it
travels beside ``frontier-bootstrap.py`` (``frontier_hostside.IMPORTED_FILES``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier_hostside.aws_cli import Aws, BootError
from frontier_hostside.names import (
    AGENT_CONFIG_NAME,
    AGENT_FILE_NAME,
    BOOT_RECORDS_PREFIX,
    CLOUDWATCH_DIMENSIONS,
    DEPLOYING_POINTER,
    DRAINING_METRIC,
    HOST_BOOT_ALLOWANCE_S,
    HOST_TOOLS_PREFIX,
    KV_USAGE_CW_METRIC,
    KV_USAGE_METRIC,
    LEADER_ADDRESS_ENV,
    LEADER_PROXY_UNIT,
    NODES_PER_REPLICA_ENV,
    PLACEHOLDER_HOST,
    PROCESS_START_METRIC,
    READY_METRIC,
    REASON_LABEL,
    RELEASE_ID_PATTERN,
    RELEASE_MANIFEST,
    REQUEST_FAILURES_METRIC,
    RESTARTS_CW_METRIC,
    RUNTIME_PID_NAME,
    RUNTIME_UP_CW_METRIC,
    START_PHASE_LABEL,
    START_PHASE_METRIC,
    STARTUP_CW_METRIC,
    STARTUP_PHASE_DIMENSION,
    STRUCTURED_FAILURES_CW_METRIC,
    STRUCTURED_OUTPUT_INVALID,
    STRUCTURED_OUTPUTS_CW_METRIC,
    STRUCTURED_OUTPUTS_METRIC,
    TTFT_CW_METRIC,
    TTFT_METRIC,
)
from frontier_hostside.release_signature import RELEASE_KEY_NAME, SIGNATURE_NAME, release_key_alias
from frontier_hostside.rendezvous import Rendezvous, RendezvousError, write_env

IMDS = "http://169.254.169.254/latest"
TERMINATING = "Terminating:Wait"
PUBLISHER_STATE = "publisher.json"


@dataclass(frozen=True)
class NodeConfig:
    stack: str
    node_group: str
    region: str
    history_bucket: str
    history_prefix: str
    root: str
    launch_hook: str
    terminate_hook: str
    metrics_url: str
    namespace: str
    queue_metric: str
    running_metric: str
    latency_metric: str
    waiting_series: str
    running_series: str
    e2e_series: str
    readiness_timeout_s: float
    instance_id: str = ""
    address: str = ""
    # Where the runtime wheels are: the stack's history prefix, shared by the pools of a stack of
    # several models (each pool's history_prefix is then its own); "" means history_prefix.
    artifacts_prefix: str = ""
    # Nodes one replica spans; above 1 the host claims its slot before each runtime start.
    nodes_per_replica: int = 1

    @classmethod
    def load(cls, path: str) -> NodeConfig:
        env = read_env(Path(path))
        keys = {
            "stack": "FRONTIER_STACK",
            "node_group": "FRONTIER_NODE_GROUP",
            "region": "AWS_REGION",
            "history_bucket": "FRONTIER_HISTORY_BUCKET",
            "history_prefix": "FRONTIER_HISTORY_PREFIX",
            "root": "FRONTIER_ROOT",
            "launch_hook": "FRONTIER_LAUNCH_HOOK",
            "terminate_hook": "FRONTIER_TERMINATE_HOOK",
            "metrics_url": "FRONTIER_METRICS_URL",
            "namespace": "FRONTIER_METRIC_NAMESPACE",
            "queue_metric": "FRONTIER_QUEUE_METRIC",
            "running_metric": "FRONTIER_RUNNING_METRIC",
            "latency_metric": "FRONTIER_LATENCY_METRIC",
            "waiting_series": "FRONTIER_WAITING_SERIES",
            "running_series": "FRONTIER_RUNNING_SERIES",
            "e2e_series": "FRONTIER_E2E_SERIES",
            "readiness_timeout_s": "FRONTIER_READINESS_TIMEOUT_S",
        }
        values = required_env(path, env, keys)
        values["readiness_timeout_s"] = float(values["readiness_timeout_s"])
        values["history_prefix"] = values["history_prefix"].rstrip("/") + "/"
        # Set where there is no instance metadata service (the local stack's host slots).
        values["instance_id"] = env.get("FRONTIER_INSTANCE_ID", "")
        values["address"] = env.get("FRONTIER_ADDRESS", "")
        artifacts = env.get("FRONTIER_ARTIFACTS_PREFIX", "")
        values["artifacts_prefix"] = artifacts.rstrip("/") + "/" if artifacts else ""
        nodes = env.get(NODES_PER_REPLICA_ENV, "1")
        if not nodes.isdigit() or int(nodes) < 1:
            raise BootError(
                f"{path}: {NODES_PER_REPLICA_ENV}={nodes!r}: must be a whole number of nodes, 1 or more"
            )
        values["nodes_per_replica"] = int(nodes)
        return cls(**values)


def read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"')
    return env


def required_env(path: str | Path, env: dict[str, str], keys: dict[str, str]) -> dict[str, Any]:
    """``keys`` (field -> variable) read from ``env``; every one named that is missing or empty."""
    missing = [key for key in keys.values() if not env.get(key)]
    if missing:
        raise BootError(f"{path}: missing {', '.join(missing)}")
    return {name: env[key] for name, key in keys.items()}


def log(message: str) -> None:
    print(f"frontier-bootstrap: {message}", file=sys.stderr, flush=True)


# --- who am I --------------------------------------------------------------------------------------


def _imds(path: str) -> str:
    token_request = urllib.request.Request(
        f"{IMDS}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    )
    with urllib.request.urlopen(token_request, timeout=5) as answer:
        token = answer.read().decode()
    request = urllib.request.Request(f"{IMDS}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(request, timeout=5) as answer:
        value: str = answer.read().decode().strip()
    return value


def identity(config: NodeConfig) -> tuple[str, str]:
    """(instance id, private address): from the configuration where set, else from IMDSv2."""
    try:
        return config.instance_id or _imds("instance-id"), config.address or _imds("local-ipv4")
    except OSError as exc:
        raise BootError(f"instance metadata unreachable: {exc}") from None


# --- the current release ---------------------------------------------------------------------------


def current_release(aws: Aws, config: NodeConfig) -> dict[str, Any] | None:
    """The newest record that succeeded (deploy or rollback): the release the stack serves now.

    Records are keyed by their start time, so the newest come last; reading from the end stops at
    the first good one, as ``HistoryStore.last_good()`` does.
    """
    prefix = config.history_prefix + "records/"
    for key in reversed(aws.keys(config.history_bucket, prefix)):
        with tempfile.TemporaryDirectory() as tmp:
            record: dict[str, Any] = json.loads(
                aws.get(config.history_bucket, key, Path(tmp) / "record.json").read_text()
            )
        if record.get("outcome") == "succeeded" and RELEASE_ID_PATTERN.match(str(record.get("release", ""))):
            return record
    return None


# names.DEPLOYING_POINTER is written by a deploy (or rollback) before it starts rolling: the release
# it rolls, until ``expires`` (its lock's expiry); a failed deploy withdraws it.


def deploying_release(aws: Aws, config: NodeConfig, now: float | None = None) -> dict[str, Any] | None:
    """The release a deploy in progress names in its pointer; None without one, or once it expired."""
    key = config.history_prefix + DEPLOYING_POINTER
    # Listed first: a missing object is then no error to tell apart from a refused read.
    if key not in aws.keys(config.history_bucket, key):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        pointer: dict[str, Any] = json.loads(
            aws.get(config.history_bucket, key, Path(tmp) / "pointer.json").read_text()
        )
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    if not RELEASE_ID_PATTERN.match(str(pointer.get("release", ""))):
        log(f"ignoring {key}: it names no release id")
        return None
    if str(pointer.get("expires", "")) <= moment:
        log(
            f"ignoring {key}: the deploy of {pointer['release']} it names expired at {pointer.get('expires')}"
        )
        return None
    return pointer


def release_to_boot(aws: Aws, config: NodeConfig) -> dict[str, Any] | None:
    """The release being deployed, where a deploy runs; else the stack's current good release."""
    return deploying_release(aws, config) or current_release(aws, config)


def release_id(digest: str, file_hashes: dict[str, str]) -> str:
    """The id a release's digest and file hashes give (the same rule as frontier.release.release)."""
    material = digest + "\n" + "".join(f"{name} {h}\n" for name, h in sorted(file_hashes.items()))
    return "r-" + hashlib.sha256(material.encode()).hexdigest()[:12]


def fetch_release(aws: Aws, config: NodeConfig, release: str, incoming: Path) -> dict[str, Any]:
    """Download releases/<id>/ into ``incoming`` and prove it is that release; its manifest."""
    base = f"{config.history_prefix}releases/{release}/"
    if incoming.exists():
        shutil.rmtree(incoming)
    download = aws.copy_prefix(config.history_bucket, base, incoming.with_name(incoming.name + ".download"))
    if not (download / RELEASE_MANIFEST).is_file():
        raise BootError(f"release {release} is not in s3://{config.history_bucket}/{base}")
    manifest: dict[str, Any] = json.loads((download / RELEASE_MANIFEST).read_text())
    incoming.mkdir(parents=True)
    (incoming / RELEASE_MANIFEST).write_bytes((download / RELEASE_MANIFEST).read_bytes())
    if (download / SIGNATURE_NAME).is_file():  # the agent checks it at stage
        (incoming / SIGNATURE_NAME).write_bytes((download / SIGNATURE_NAME).read_bytes())
    for name, want in sorted(manifest["files"].items()):
        if "/" in name or name.startswith("."):
            raise BootError(f"release {release}: refusing file name {name!r}")
        source = download / "files" / name
        if not source.is_file():
            raise BootError(f"release {release}: {name} is missing from the history")
        path = incoming / name
        shutil.copyfile(source, path)
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != want:
            raise BootError(f"release {release}: {name} has sha256 {got}, {RELEASE_MANIFEST} says {want}")
    shutil.rmtree(download)
    computed = release_id(manifest["digest"], manifest["files"])
    if manifest.get("id") != release or computed != release:
        raise BootError(f"release {release}: its manifest gives id {computed}; refusing it")
    return manifest


def fetch_wheel(aws: Aws, config: NodeConfig, artifact: dict[str, Any], target_dir: Path) -> str:
    """The release's wheel (local stack: the runtime runs from it), verified by its digest; "" for images."""
    if artifact.get("kind") != "wheel":
        return ""
    digest, filename = artifact["digest"], artifact["filename"]
    key = f"{config.artifacts_prefix or config.history_prefix}artifacts/{digest.replace(':', '-')}/{filename}"
    path = aws.get(config.history_bucket, key, target_dir / filename)
    got = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    if got != digest:
        raise BootError(f"artifact {filename} has {got}, the release names {digest}")
    return str(path)


# --- the host agent --------------------------------------------------------------------------------


def install_agent(aws: Aws, config: NodeConfig, host: str, address: str) -> Path:
    """The agent and its configuration (this host's name and address filled in) under <root>/bin."""
    bin_dir = Path(config.root) / "bin"
    tools = f"{config.history_prefix}{HOST_TOOLS_PREFIX}{config.node_group}/"
    # cloud-init fetched them already on EC2; the local stack's slots fetch them here.
    if not (bin_dir / AGENT_FILE_NAME).is_file() or not (bin_dir / AGENT_CONFIG_NAME).is_file():
        aws.copy_prefix(config.history_bucket, tools, bin_dir)
    # What came from S3 still names no host: keep it as the template this host's config is made from.
    template = bin_dir / (AGENT_CONFIG_NAME + ".template")
    fetched = json.loads((bin_dir / AGENT_CONFIG_NAME).read_text())
    if fetched.get("host") == PLACEHOLDER_HOST or not template.is_file():
        template.write_text(json.dumps(fetched, indent=2, sort_keys=True) + "\n")
    agent_config = json.loads(template.read_text())
    agent_config.update({"host": host, "address": address, "root": config.root, "python": sys.executable})
    target = bin_dir / AGENT_CONFIG_NAME
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(agent_config, indent=2, sort_keys=True) + "\n")
    tmp.replace(target)
    return bin_dir / AGENT_FILE_NAME


def install_release_key(aws: Aws, config: NodeConfig) -> bool:
    """``<root>/release-key.pub``: the stack's release key as KMS gives it (kms:GetPublicKey). From
    then on the agent stages and activates only releases it signed. False where the stack has none:
    no such key, or none its role is granted (a stack with a key grants it: the Foundation's
    documents do both)."""
    try:
        answer = aws.run("kms", "get-public-key", "--key-id", release_key_alias(config.stack))
    except BootError as exc:
        if "NotFoundException" in str(exc) or "AccessDenied" in str(exc):
            log(f"no release key for this host ({str(exc)[:200]}): releases are held to their manifests only")
            return False
        raise
    target = Path(config.root) / RELEASE_KEY_NAME
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(str(answer["PublicKey"]) + "\n")
    tmp.replace(target)
    return True


def agent(config: NodeConfig, *args: str, timeout: float = 600) -> dict[str, Any]:
    """One host-agent command; its JSON answer, or BootError with the agent's own words."""
    bin_dir = Path(config.root) / "bin"
    argv = [
        sys.executable,
        str(bin_dir / AGENT_FILE_NAME),
        "--config",
        str(bin_dir / AGENT_CONFIG_NAME),
        *args,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    answer: dict[str, Any] = {}
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            answer = json.loads(line)
            break
    if done.returncode != 0 or not answer.get("ok", True):
        raise BootError(f"agent {args[0]}: {answer.get('error') or done.stderr.strip() or done.returncode}")
    return answer


# --- boot ------------------------------------------------------------------------------------------


def _record(aws: Aws, config: NodeConfig, host: str, outcome: str, release: str, reason: str) -> None:
    moment = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    record = {
        "kind": "bootstrap",
        "stack": config.stack,
        "node_group": config.node_group,
        "host": host,
        "at": moment,
        "release": release,
        "outcome": outcome,
        "reason": reason,
    }
    key = f"{config.history_prefix}{BOOT_RECORDS_PREFIX}{moment}-{host}.json"
    try:
        aws.put(config.history_bucket, key, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    except BootError as exc:  # the hook's outcome matters more than its record
        log(f"could not write the boot record: {exc}")


def boot(config: NodeConfig, aws: Aws) -> dict[str, Any]:
    """Serve the current release, then CONTINUE the launch hook; ABANDON it with the reason otherwise."""
    instance_id, address = identity(config)
    group, state = aws.group_of(instance_id)
    release = ""
    try:
        install_agent(aws, config, instance_id, address)
        install_release_key(aws, config)
        record = release_to_boot(aws, config)
        if record is None:
            # Nothing was ever deployed: the host joins empty and the first `fab deploy` fills it.
            # Until then it fails the target group's health check, so it takes no traffic, and its
            # group does not replace it for that: Pulumi creates the group with ReplaceUnhealthy
            # suspended, and the first deploy that succeeds resumes it (infra/nodes.py).
            outcome, reason = "empty", "no successful deploy in the history yet; waiting for `fab deploy`"
        else:
            release = record["release"]
            facts = agent(config, "facts", "--release", release)
            if facts.get("current") == release and facts.get("running"):
                reason = f"already runs {release}"
            else:
                incoming = Path(config.root) / "incoming" / release
                manifest = fetch_release(aws, config, release, incoming)
                wheel = fetch_wheel(
                    aws, config, manifest.get("artifact", {}), Path(config.root) / "artifacts"
                )
                agent(config, "stage", release, str(incoming), *(["--wheel", wheel] if wheel else []))
                agent(config, "start", "--activate", release)
                reason = f"serves {release}"
            agent(
                config, "wait-ready", str(config.readiness_timeout_s), timeout=config.readiness_timeout_s + 60
            )
            outcome = "continued"
    except (BootError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        reason = str(exc) or type(exc).__name__
        log(f"ABANDON: {reason}")
        _record(aws, config, instance_id, "abandoned", release, reason)
        if group and state.startswith("Pending"):
            aws.complete(group, config.launch_hook, instance_id, "ABANDON")
        return {"ok": False, "outcome": "abandoned", "release": release, "reason": reason, "group": group}
    log(f"CONTINUE: {reason}")
    _record(aws, config, instance_id, outcome, release, reason)
    if group and state.startswith("Pending"):
        aws.complete(group, config.launch_hook, instance_id, "CONTINUE")
    return {"ok": True, "outcome": outcome, "release": release, "reason": reason, "group": group}


def prefetch(config: NodeConfig, aws: Aws) -> dict[str, Any]:
    """Warm this host for the release a boot would serve, and start nothing: the host tools, the
    release fetched, verified and staged, and the weights cache filled with what that release's
    start reads (the agent's ``prefetch``). A ``boot`` afterwards stages the release again (a few
    small files) and its runtime's start finds every weights file verified: no weights GET.
    A host that is told to replace one at risk runs this first, so the fetch is done before it
    is needed. No lifecycle hook is completed: the host is not in service until ``boot``."""
    instance_id, address = identity(config)
    install_agent(aws, config, instance_id, address)
    install_release_key(aws, config)
    record = release_to_boot(aws, config)
    if record is None:
        return {"ok": False, "outcome": "empty", "reason": "no successful deploy in the history yet"}
    release = record["release"]
    incoming = Path(config.root) / "incoming" / release
    manifest = fetch_release(aws, config, release, incoming)
    wheel = fetch_wheel(aws, config, manifest.get("artifact", {}), Path(config.root) / "artifacts")
    agent(config, "stage", release, str(incoming), *(["--wheel", wheel] if wheel else []))
    warmed = agent(config, "prefetch", "--release", release, timeout=config.readiness_timeout_s + 60)
    log(f"warmed for {release}: {warmed.get('bytes_downloaded', 0)} bytes fetched")
    return {"ok": True, "outcome": "warmed", "release": release, "prefetch": warmed}


# --- a replica over several nodes: which node this host is ------------------------------------------


def replica_env(
    config: NodeConfig, aws: Aws, out: Path, leader_env: Path, restart_proxy: bool = False
) -> dict[str, Any]:
    """Claim (or find) this host's slot and write what the runtime unit reads (``out``, 0600 under
    /run). A worker also gets its leader's address in ``leader_env`` for its leader proxy, which
    ``restart_proxy`` restarts (without waiting: this runs inside the runtime unit's start)."""
    if config.nodes_per_replica < 2:
        raise BootError(
            f"{NODES_PER_REPLICA_ENV} is {config.nodes_per_replica}: a replica on one node has no slot to claim"
        )
    instance_id, address = identity(config)
    slots = Rendezvous(
        aws, config.history_prefix, config.node_group, config.nodes_per_replica, instance_id, address
    )
    try:
        claim = slots.claim()
    except RendezvousError as exc:
        raise BootError(str(exc)) from None
    write_env(claim, out)
    if claim.node == 0:
        leader_env.unlink(missing_ok=True)
        action = "stop"
    else:
        leader_env.parent.mkdir(parents=True, exist_ok=True)
        tmp = leader_env.with_name(f".{leader_env.name}.tmp")
        tmp.write_text(f"{LEADER_ADDRESS_ENV}={claim.leader_address}\n")
        tmp.replace(leader_env)
        action = "restart"
    if restart_proxy:
        subprocess.run(
            ["systemctl", "--no-block", action, f"{LEADER_PROXY_UNIT}.service"], check=False, timeout=30
        )
    log(f"replica {claim.replica} node {claim.node}: runs {claim.command}, leader {claim.leader_address}")
    return {"ok": True, **claim.public()}


def abandon(config: NodeConfig, aws: Aws, reason: str) -> dict[str, Any]:
    instance_id, _ = identity(config)
    group, state = aws.group_of(instance_id)
    log(f"ABANDON: {reason}")
    _record(aws, config, instance_id, "abandoned", "", reason)
    # Only a launch waits for an answer; a host that already serves (a later boot) just logs it.
    if group and state.startswith("Pending"):
        aws.complete(group, config.launch_hook, instance_id, "ABANDON")
    return {"ok": False, "outcome": "abandoned", "reason": reason, "group": group}


# --- metrics to CloudWatch -------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"] or ""))
        samples.append((match["name"], labels, float(match["value"])))
    return samples


def histogram_buckets(samples: list[tuple[str, dict[str, str], float]], name: str) -> dict[float, float]:
    """Cumulative counts by upper bound, summed over label sets (models, routes)."""
    buckets: dict[float, float] = {}
    for sample, labels, value in samples:
        if sample == f"{name}_bucket" and "le" in labels:
            bound = float("inf") if labels["le"] in ("+Inf", "Inf") else float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def latency_values(before: dict[float, float], now: dict[float, float]) -> tuple[list[float], list[float]]:
    """Requests finished since ``before``, as (values in ms, counts): one value per histogram bucket,
    its upper bound (the +Inf bucket takes the largest finite bound). A restarted runtime (counts
    lower than before) starts from zero."""
    if any(now.get(bound, 0.0) < count for bound, count in before.items()):
        before = {}
    values, counts, below = [], [], 0.0
    finite = sorted(b for b in now if b != float("inf"))
    for bound in sorted(now):
        delta = now[bound] - before.get(bound, 0.0)
        in_bucket = delta - below
        below = delta
        if in_bucket > 0:
            value = bound if bound != float("inf") else (finite[-1] if finite else 0.0)
            values.append(round(value * 1000, 3))
            counts.append(in_bucket)
    return values, counts


def counter_total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """A counter's value summed over its label sets (those matching ``labels``)."""
    return sum(
        value
        for sample, have, value in samples
        if sample == f"{name}_total" and all(have.get(k) == v for k, v in labels.items())
    )


def _since(before: Any, now: float) -> float:
    """A counter's increase since the last publish; a restarted runtime (lower now) counts from zero."""
    try:
        earlier = float(before)
    except (TypeError, ValueError):
        return 0.0  # the first publish: its counts are the runtime's life so far, not this minute's
    return now - earlier if now >= earlier else now


def host_booted_at() -> float:
    """When this host booted (wall clock), from ``/proc/uptime``; 0 where that cannot be read."""
    try:
        return time.time() - float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def runtime_down(
    samples: list[tuple[str, dict[str, str], float]] | None,
    now: float,
    launched_at: float | None,
    booted_at: float,
    start_allowance_s: float,
) -> bool:
    """Whether the runtime-down alarm counts this host's runtime as down (``samples``: its /metrics,
    None where they do not answer). Not down: ready; draining (a rollout or a scale-in stopping it);
    or starting — its process younger than the start allowance (``rollout.readiness_timeout_s``:
    loading), or, not answering yet, its last launch by the agent (``launched_at``) younger than
    that, or, before any launch, the host's boot younger than the launch hook waits for it
    (:data:`HOST_BOOT_ALLOWANCE_S` more). A replica that loads longer than a rollout would wait for
    it is down."""
    if samples is not None:
        if any(value >= 1 for name, _, value in samples if name in (READY_METRIC, DRAINING_METRIC)):
            return False
        started = next((value for name, _, value in samples if name == PROCESS_START_METRIC), None)
        if started is not None:
            return now - started >= start_allowance_s
    if launched_at is not None:
        return now - launched_at >= start_allowance_s
    return now - booted_at >= HOST_BOOT_ALLOWANCE_S + start_allowance_s


def _launched_at(config: NodeConfig) -> float | None:
    try:
        return (Path(config.root) / "run" / RUNTIME_PID_NAME).stat().st_mtime
    except OSError:
        return None


def publish(config: NodeConfig, aws: Aws, booted_at: float | None = None) -> dict[str, Any]:
    """One scrape of the runtime, into CloudWatch: the queue, the requests running, the end-to-end
    latency and the time to first token (values with counts of what finished since the last
    publish), the fullest KV cache, the constrained outputs checked and failed since the last
    publish, whether the runtime is up (:func:`runtime_down`: what the runtime-down alarm reads)
    and restarts, and once per runtime start its phases (StartupSeconds). A runtime that does not
    answer is published as up or down and nothing else."""
    stack_dimension, group_dimension = CLOUDWATCH_DIMENSIONS
    dimensions = [
        {"Name": stack_dimension, "Value": config.stack},
        {"Name": group_dimension, "Value": config.node_group},
    ]
    booted = host_booted_at() if booted_at is None else booted_at

    def down(samples: list[tuple[str, dict[str, str], float]] | None) -> bool:
        return runtime_down(samples, time.time(), _launched_at(config), booted, config.readiness_timeout_s)

    try:
        with urllib.request.urlopen(config.metrics_url, timeout=5) as answer:
            samples = parse_prometheus(answer.read().decode())
    except OSError as exc:
        is_down = down(None)
        up = {
            "MetricName": RUNTIME_UP_CW_METRIC,
            "Dimensions": dimensions,
            "Value": 0 if is_down else 1,
            "Unit": "Count",
        }
        aws.put_metrics(config.namespace, [up])
        return {
            "ok": False,
            "ready": False,
            "down": is_down,
            "error": f"the runtime's metrics do not answer: {exc}",
        }
    waiting = sum(v for name, _, v in samples if name == config.waiting_series)
    running = sum(v for name, _, v in samples if name == config.running_series)
    buckets = histogram_buckets(samples, config.e2e_series)
    ttft_buckets = histogram_buckets(samples, TTFT_METRIC)
    state_path = Path(config.root) / "run" / PUBLISHER_STATE
    try:
        before_state = json.loads(state_path.read_text())
        before = {float(k): v for k, v in before_state.get("buckets", {}).items()}
        ttft_before = {float(k): v for k, v in before_state.get("ttft", {}).items()}
    except (OSError, ValueError, AttributeError):
        before_state, before, ttft_before = {}, {}, {}
    values, counts = latency_values(before, buckets)
    ttft_values, ttft_counts = latency_values(ttft_before, ttft_buckets)
    ready = any(v >= 1 for name, _, v in samples if name == READY_METRIC)
    is_down = down(samples)
    kv_usage = [v for name, _, v in samples if name == KV_USAGE_METRIC]
    checked = counter_total(samples, STRUCTURED_OUTPUTS_METRIC)
    failed = counter_total(samples, REQUEST_FAILURES_METRIC, **{REASON_LABEL: STRUCTURED_OUTPUT_INVALID})

    def count(metric: str, value: float) -> dict[str, Any]:
        return {"MetricName": metric, "Dimensions": dimensions, "Value": value, "Unit": "Count"}

    data: list[dict[str, Any]] = [
        count(config.queue_metric, waiting),
        count(config.running_metric, running),
        count(RUNTIME_UP_CW_METRIC, 0 if is_down else 1),
        count(STRUCTURED_OUTPUTS_CW_METRIC, _since(before_state.get("structured_checked"), checked)),
        count(STRUCTURED_FAILURES_CW_METRIC, _since(before_state.get("structured_failed"), failed)),
    ]
    if kv_usage:
        data.append(
            {
                "MetricName": KV_USAGE_CW_METRIC,
                "Dimensions": dimensions,
                "Value": max(kv_usage),
                "Unit": "None",
            }
        )
    for metric, found, found_counts in (
        (config.latency_metric, values, counts),
        (TTFT_CW_METRIC, ttft_values, ttft_counts),
    ):
        if found:
            data.append(
                {
                    "MetricName": metric,
                    "Dimensions": dimensions,
                    "Values": found,
                    "Counts": found_counts,
                    "Unit": "Milliseconds",
                }
            )
    # Each start's phases once, when the host first sees that process ready: one datapoint a start,
    # so a week's Maximum is the slowest start, whatever the hosts' uptimes.
    started_at = next((v for name, _, v in samples if name == PROCESS_START_METRIC), None)
    phases = start_phases(samples) if ready else {}
    new_start = bool(phases) and started_at is not None and before_state.get("startup_of") != started_at
    if new_start:
        for phase, seconds in sorted(phases.items()):
            phase_dimensions = [*dimensions, {"Name": STARTUP_PHASE_DIMENSION, "Value": phase}]
            data.append(
                {
                    "MetricName": STARTUP_CW_METRIC,
                    "Dimensions": phase_dimensions,
                    "Value": seconds,
                    "Unit": "Seconds",
                }
            )
    # Restarts by the supervisor (or systemd's watchdog) since the last publish: a host that heals
    # itself all the time shows up here, not only in its own log.
    restarts = _restarts(config)
    restarted = max(0, restarts - int(before_state.get("restarts", restarts)))
    data.append(count(RESTARTS_CW_METRIC, restarted))
    aws.put_metrics(config.namespace, data)
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(
        json.dumps(
            {
                "buckets": {str(k): v for k, v in buckets.items()},
                "ttft": {str(k): v for k, v in ttft_buckets.items()},
                "restarts": restarts,
                "structured_checked": checked,
                "structured_failed": failed,
                "startup_of": started_at if new_start else before_state.get("startup_of"),
            }
        )
    )
    return {
        "ok": True,
        "ready": ready,
        "down": is_down,
        "queue_depth": waiting,
        "running": running,
        "latency_requests": sum(counts),
        "ttft_requests": sum(ttft_counts),
        "kv_usage": max(kv_usage) if kv_usage else None,
        "structured_checked": _since(before_state.get("structured_checked"), checked),
        "structured_failed": _since(before_state.get("structured_failed"), failed),
        "restarts": restarted,
        "startup": phases if new_start else {},
    }


def start_phases(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """The runtime's start, phase by phase (seconds), from its ``frontier_start_phase_seconds``."""
    return {
        labels[START_PHASE_LABEL]: value
        for name, labels, value in samples
        if name == START_PHASE_METRIC and START_PHASE_LABEL in labels
    }


def _restarts(config: NodeConfig) -> int:
    """How often the runtime was restarted on this host (the agent's ``status``); 0 when unknown."""
    try:
        return int(agent(config, "status", timeout=30).get("restarts", 0))
    except (BootError, OSError, ValueError, subprocess.TimeoutExpired):
        return 0


# --- scale-in: drain, then let the group terminate -------------------------------------------------


def drain_if_terminating(config: NodeConfig, aws: Aws) -> dict[str, Any] | None:
    instance_id, _ = identity(config)
    group, state = aws.group_of(instance_id)
    if state != TERMINATING:
        return None
    log(f"{state}: draining the runtime before {group} terminates this host")
    try:
        agent(config, "stop", timeout=900)
        reason = "drained"
    except BootError as exc:
        reason = f"stop failed, terminating anyway: {exc}"
    aws.complete(group, config.terminate_hook, instance_id, "CONTINUE")
    return {"ok": True, "outcome": "terminating", "reason": reason, "group": group}


def watch(config: NodeConfig, aws: Aws, interval_s: float, rounds: int = 0) -> dict[str, Any]:
    """Publish and watch for scale-in until terminated (``rounds`` > 0 stops after that many)."""
    done = 0
    while True:
        try:
            publish(config, aws)
        except (OSError, BootError, ValueError) as exc:  # a runtime that is down publishes nothing
            log(f"publish: {exc}")
        try:
            drained = drain_if_terminating(config, aws)
        except BootError as exc:
            log(f"lifecycle: {exc}")
            drained = None
        if drained is not None:
            return drained
        done += 1
        if rounds and done >= rounds:
            return {"ok": True, "outcome": "watching", "rounds": done}
        time.sleep(interval_s)
