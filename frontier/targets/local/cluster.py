"""The embedded local stack: a whole cluster on this one machine, no cloud, no GPU.

``up`` brings up, from the stack file's ``local:`` and ``inventory:`` sections:

* **moto's server** on ``local.moto_port`` standing in for S3, Secrets Manager and CloudWatch, with
  the weights and history buckets and each pool's API-key secret ``runtime.api_keys_secret``. A key
  is generated here and kept only in moto and in a 0600 file under the state dir (``api-key``, or
  ``api-key-<model>`` where the stack file lists its models) for local clients such as the demo and
  ``fab loadtest``. moto enforces IAM: each actor signs with the
  key of its own user, whose policies are the cloud roles' documents
  (:mod:`frontier.targets.local.iam`); ``fab`` is the deploy role, the host slots the runtime role.
* **host slots** from ``inventory.hosts``: each gets its own root (``releases/``, ``current``, a
  weights cache) and an ``env`` file pointing the AWS SDK at moto (``AWS_ENDPOINT_URL``, the host
  role's key …). Each
  slot is reached over **real SSH** — a private sshd on the host's loopback alias and ``ssh_port``
  admitting the stack's key (``inventory.ssh_key_file``, generated when missing) — or, where no sshd
  binary exists, over a **local connection** (commands run on this machine directly). The choice:
  ``$FRONTIER_LOCAL_CONNECTION`` (``ssh`` or ``local``) when set, else ``ssh`` when
  ``/usr/sbin/sshd`` exists, else ``local``. It is recorded in ``<state_dir>/local.json``
  (:func:`connection_mode`) so every later task connects the same way.
* **HAProxy** on ``local.balancer_port`` from the rendered ``haproxy.cfg``, with active health
  checks on the readiness path, its admin socket under the state dir, and a stats page on
  ``local.balancer_stats_port``.
* **an IMDS stand-in and the agent's interruption watcher per slot**
  (:mod:`frontier.targets.local.imds`): EC2's instance metadata service cannot run here, so each
  slot gets an IMDSv2 endpoint on its own loopback address (a free port, in its service record),
  and the host agent's ``interruptions`` command polls it from the slot's ``bin/`` — cloud-init's
  copy of the agent, written here — as a spot host's ``frontier-interruptions.service`` polls
  169.254.169.254. A notice posted to it (``fab spot.notice``, :mod:`frontier.targets.local.notices`)
  takes the slot out of service as a spot notice does on EC2, and tells the stack's gateway first.
* **a trace receiver** (:mod:`frontier.targets.local.traces`) on a free loopback port (in its
  service record), writing spans to ``<state_dir>/traces/spans.jsonl``; the slots' ``env`` and the
  gateway name it in ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, so runtimes and gateway send it their
  request spans.

Every daemon is a :mod:`frontier.targets.local.services` service with its pid and record under the
state dir, so ``up`` is idempotent (it reports what already runs and starts only what is missing)
and ``down`` stops exactly what ``up`` started, plus any runtime processes still running on the
host slots.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import frontier_hostside
from frontier_hostside.agent import terminate_then_kill
from frontier_hostside.names import (
    AGENT_CONFIG_NAME,
    AGENT_FILE_NAME,
    HAPROXY_ADMIN_SOCKET,
    LOCAL_AWS_KEY_ID,
    LOCAL_AWS_SECRET,
    SUPERVISOR_PID_NAME,
)
from frontier_hostside.release_signature import RELEASE_KEY_NAME

from frontier import aws, project
from frontier.config.schema import Host, Local, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.identity.pools import principal_suffix
from frontier.release.signing import find_release_key
from frontier.render.host import render_agent_config
from frontier.targets.local import iam, imds, services, traces
from frontier.targets.local.balancer import balancer_backends, render_haproxy
from frontier.targets.local.group import STATE_FILE as GROUP_STATE_FILE

STATE_FILE = "local.json"
API_KEY_FILE = "api-key"
CONNECTION_ENV = "FRONTIER_LOCAL_CONNECTION"
# How often a slot's agent asks its IMDS stand-in for notices. EC2's hosts ask every 5 s
# (frontier_hostside.interruption.POLL_INTERVAL_S); a slot asks every second so that a notice's
# drill shows the slot out of HAProxy's rotation within 5 s of it, health checks included.
IMDS_POLL_S = 1.0


class LocalStackError(FrontierError):
    """The local stack cannot be brought up or used as asked."""


@dataclass(frozen=True)
class Component:
    """One line of ``local.up`` / ``local.down`` output."""

    name: str
    state: str  # started | running | created | exists | stopped | absent
    detail: str


# --- where things are -----------------------------------------------------------------------------


def resolve(path: str | Path) -> Path:
    """A stack path: absolute as given, relative ones against the repository root."""
    return project.resolve(path).resolve()


def require_local(
    settings: Settings, purpose: str = "local.up only runs the embedded local stack (try --stack local)"
) -> Local:
    """The stack's ``local:`` section; LocalStackError saying ``purpose`` where it runs elsewhere."""
    if not isinstance(settings.platform, Local):
        raise LocalStackError(f"stack {settings.stack!r} has no 'frontier:local' section: {purpose}")
    return settings.platform


def state_dir(settings: Settings) -> Path:
    local = require_local(settings)
    return resolve(local.state_dir)


def host_root(host: Host) -> Path:
    return resolve(host.root)


def ssh_key_file(settings: Settings) -> Path:
    if settings.inventory.ssh_key_file:
        return resolve(settings.inventory.ssh_key_file)
    return state_dir(settings) / "ssh" / "id_ed25519"


def moto_endpoint(settings: Settings) -> str:
    local = require_local(settings)
    return f"http://127.0.0.1:{local.moto_port}"


def balancer_url(settings: Settings) -> str:
    local = require_local(settings)
    return f"http://127.0.0.1:{local.balancer_port}"


def admin_socket(settings: Settings) -> Path:
    return state_dir(settings) / HAPROXY_ADMIN_SOCKET


def access_key(settings: Settings, actor: str) -> iam.AccessKey:
    """The key ``actor`` (admin, host, deploy, gateway) signs with on the local stack's moto.

    Before ``up`` has made the stack's users (or against a moto that checks nothing), the stack's
    placeholder key: moto accepts any key until it enforces IAM.
    """
    found = iam.read_keys(state_dir(settings)).get(actor)
    return found or iam.AccessKey(LOCAL_AWS_KEY_ID, LOCAL_AWS_SECRET)


def aws_env(settings: Settings, actor: str = "deploy") -> dict[str, str]:
    """The standard AWS environment that points every SDK call at moto's server as ``actor``."""
    return {
        "AWS_ENDPOINT_URL": moto_endpoint(settings),
        **access_key(settings, actor).env(),
        "AWS_DEFAULT_REGION": settings.region,
        "AWS_REGION": settings.region,
    }


def aws_client(settings: Settings, service: str, actor: str = "deploy") -> Any:
    """A boto3 client for the local stack: its moto server as ``actor`` (``fab`` is the deploy role),
    unless the environment names another endpoint (then its credentials are that endpoint's)."""
    extra: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint or endpoint == moto_endpoint(settings):
        extra = {"endpoint_url": moto_endpoint(settings), **access_key(settings, actor).boto3_kwargs()}
    elif not os.environ.get("AWS_ACCESS_KEY_ID"):
        # A moto that checks nothing accepts any key; a fresh shell has none.
        extra.update(aws_access_key_id=LOCAL_AWS_KEY_ID, aws_secret_access_key=LOCAL_AWS_SECRET)
    return aws.client(settings, service, **extra)


@contextlib.contextmanager
def aws_environment(settings: Settings):
    """Within the block, boto3 in this process talks to the local stack's moto server."""
    saved = {k: os.environ.get(k) for k in (*aws_env(settings), "AWS_PROFILE", "AWS_SESSION_TOKEN")}
    os.environ.update(aws_env(settings))
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bucket_names(settings: Settings) -> dict[str, str]:
    """The buckets the local stack creates: the weights bucket (every pool's, :attr:`Settings.weights_root`)
    and the history bucket."""
    weights = settings.weights_root.removeprefix("s3://").split("/", 1)[0]
    return {"weights": weights, "history": history_bucket(settings)}


def history_bucket(settings: Settings) -> str:
    """The local stack's release-history bucket (a cloud stack's comes from its Pulumi outputs)."""
    return f"frontier-{settings.stack}-history"


def connection_mode(settings: Settings) -> str:
    """``ssh`` or ``local``: how tasks reach the host slots (recorded by ``up``; chosen if not up)."""
    recorded = _read_state(settings).get("connection")
    return recorded or _choose_connection()


def _choose_connection() -> str:
    forced = os.environ.get(CONNECTION_ENV, "").strip()
    if forced:
        if forced not in ("ssh", "local"):
            raise LocalStackError(f"${CONNECTION_ENV} = {forced!r}: must be 'ssh' or 'local'")
        return forced
    return "ssh" if os.access(services.SSHD, os.X_OK) else "local"


def api_key_file(settings: Settings, pool: PoolSettings) -> Path:
    """The 0600 client copy of ``pool``'s runtimes' first key: one file per pool, named as its
    principal is (a one-model stack's keeps the name it always had)."""
    return state_dir(settings) / f"{API_KEY_FILE}{principal_suffix(settings, pool)}"


def api_key(settings: Settings, pool: PoolSettings) -> str:
    """The API key of ``pool``'s runtimes, from its 0600 file (written by ``up``)."""
    path = api_key_file(settings, pool)
    if not path.exists():
        raise LocalStackError(f"{path}: no API key yet — run `fab local.up --stack {settings.stack}` first")
    return path.read_text().strip()


def refresh_api_key(settings: Settings, secret_id: str, secretsmanager: Any) -> str | None:
    """Write the secret's first key (the one clients use) to its pool's client copy, if ``secret_id``
    is a pool's secret; what was done, or None when this stack keeps no copy of it."""
    owners = [pool for pool in settings.pools if pool.runtime.api_keys_secret == secret_id]
    if not owners:
        return None
    path = api_key_file(settings, owners[0])  # the stack check gives each pool a secret of its own
    value = secretsmanager.get_secret_value(SecretId=secret_id)["SecretString"]
    _write_private(path, json.loads(value)["keys"][0] + "\n")
    return f"client copy of the new key: {path} (mode 0600)"


def _read_state(settings: Settings) -> dict:
    path = state_dir(settings) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# --- up -------------------------------------------------------------------------------------------


def up(settings: Settings) -> list[Component]:
    """Bring the local stack up; start only what is not running yet. Returns what it found or did."""
    require_local(settings)
    state = state_dir(settings)
    state.mkdir(parents=True, exist_ok=True)
    connection = _choose_connection()
    services.require_binary("haproxy", "haproxy")
    services.require_python_module("moto.server", "moto[server]")
    if connection == "ssh":
        services.require_binary(services.SSHD, "openssh-server")

    _check_ports(settings, state, connection)
    moto = _up_moto(settings, state)
    report = [moto, identities(settings, fresh=moto.state == "started")]
    report.append(_up_traces(settings, state))  # before the slots: their env files name it
    report += _up_aws_resources(settings, state)
    key = _ensure_ssh_key(settings) if connection == "ssh" else None
    for host in settings.inventory.hosts:
        report.append(_prepare_host(settings, host))
        if key is not None:
            report.append(_up_sshd(settings, host, state, key))
        report += _up_interruptions(settings, host, state)
    report.append(_up_haproxy(settings, state))
    report.append(_up_alarms(settings, state))
    _write_state(settings, state, connection)
    return report


def _check_ports(settings: Settings, state: Path, connection: str) -> None:
    """Fail before starting anything when a port of a service that is not running yet is taken."""
    local = require_local(settings)
    wanted = [("moto", "127.0.0.1", local.moto_port)]
    if connection == "ssh":
        wanted += [(f"sshd-{h.name}", h.address, h.ssh_port) for h in settings.inventory.hosts]
    wanted += [
        ("haproxy", "127.0.0.1", local.balancer_port),
        ("haproxy", "127.0.0.1", local.balancer_stats_port),
    ]
    for name, address, port in wanted:
        if services.find(state, name) is None:
            services.require_free_port(address, port, name)


def _up_moto(settings: Settings, state: Path) -> Component:
    local = require_local(settings)
    running = services.find(state, "moto")
    if running is not None:
        return Component("moto", "running", f"{running.endpoint} (pid {running.pid})")
    # IAM enforced from the start: the first calls make the admin user, every later one is checked.
    service = services.start_moto(local.moto_port, state, env=iam.MOTO_ENV)
    return Component(
        "moto",
        "started",
        f"{service.endpoint} (pid {service.pid}): S3, Secrets Manager, CloudWatch; IAM enforced",
    )


def identities(settings: Settings, *, fresh: bool = False) -> Component:
    """Each actor's IAM user on the stack's moto, with the policies the stack's settings render
    (``fresh``: moto has just started and has no users yet). Run again when the stack file changes
    (more models, a gateway, tenants), as ``pulumi up`` would apply a cloud stack's."""
    detail, _ = iam.provision(
        settings,
        moto_endpoint(settings),
        state_dir(settings),
        history_bucket(settings),
        history_prefix(settings),
        fresh=fresh,
    )
    return Component("iam", "created" if fresh else "exists", detail)


def history_prefix(settings: Settings) -> str:
    """The local stack's history prefix in its history bucket."""
    return f"history/{settings.stack}/"


def _up_aws_resources(settings: Settings, state: Path) -> list[Component]:
    # What Pulumi creates on a cloud stack is the admin's to create here.
    s3 = aws_client(settings, "s3", actor="admin")
    report = []
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    for role, bucket in bucket_names(settings).items():
        if bucket in existing:
            report.append(Component(f"bucket {role}", "exists", f"s3://{bucket}"))
            continue
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        report.append(Component(f"bucket {role}", "created", f"s3://{bucket} (versioned)"))

    return [*report, *api_key_secrets(settings)]


def api_key_secrets(settings: Settings) -> list[Component]:
    """Each pool's API-key secret, with a generated key where it has none yet, and its client copy:
    run again when the stack file lists more models, as ``pulumi up`` would add their secrets."""
    from botocore.exceptions import ClientError

    sm = aws_client(settings, "secretsmanager", actor="admin")
    report = []
    for pool in settings.pools:
        secret_id = pool.runtime.api_keys_secret or ""
        key_file = api_key_file(settings, pool)
        try:
            value = sm.get_secret_value(SecretId=secret_id)["SecretString"]
            key = json.loads(value)["keys"][0]
            state_word = "exists"
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            key = "fk-" + secrets.token_urlsafe(24)
            sm.create_secret(Name=secret_id, SecretString=json.dumps({"keys": [key]}))
            state_word = "created"
        _write_private(key_file, key + "\n")
        report.append(
            Component(
                f"api key secret{principal_suffix(settings, pool)}",
                state_word,
                f"{secret_id} (client copy: {key_file}, mode 0600)",
            )
        )
    return report


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def _ensure_ssh_key(settings: Settings) -> str:
    key = ssh_key_file(settings)
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        keygen = services.require_binary("ssh-keygen", "openssh-client")
        subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"frontier-{settings.stack}", "-f", str(key)],
            check=True,
        )
    return Path(f"{key}.pub").read_text().strip()


def host_env(settings: Settings, host: Host) -> dict[str, str]:
    """What a host slot's ``env`` file holds: the AWS environment (the host role's key) and where
    the slot lives."""
    return {
        # The host's pool's principal: its pool's weights, secret and history only.
        **aws_env(settings, iam.host_actor(settings, iam.pool_of_host(settings, host))),
        # Where the slot's runtime sends request spans: the stack's receiver (see traces.py).
        **traces_env(settings),
        "FRONTIER_HOST": host.name,
        "FRONTIER_HOST_ADDRESS": host.address,
        "FRONTIER_ROOT": str(host_root(host)),
    }


def _prepare_host(settings: Settings, host: Host) -> Component:
    root = host_root(host)
    created = not root.exists()
    for sub in ("releases", "cache/weights", "logs", "run", "bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    _install_agent(settings, host)
    env = "".join(f"{k}={v}\n" for k, v in sorted(host_env(settings, host).items()))
    env_file = root / "env"
    if not env_file.exists() or env_file.read_text() != env:
        # It holds the host role's secret key, as an instance's metadata service would: owner only.
        _write_private(env_file, env)
    # The stack's release key, read as the slot's own host role (kms:GetPublicKey), as a cloud
    # host's bootstrap reads it: from now on its agent runs only releases that key signed.
    found = find_release_key(
        aws_client(settings, "kms", actor=iam.host_actor(settings, iam.pool_of_host(settings, host))),
        settings.stack,
    )
    key_file = root / RELEASE_KEY_NAME
    if found is not None and (not key_file.is_file() or key_file.read_text().strip() != found.public_key):
        key_file.write_text(found.public_key + "\n")
    return Component(f"host {host.name}", "created" if created else "exists", f"root {root}")


def _install_agent(settings: Settings, host: Host) -> None:
    """The host agent, the files it imports and its configuration under the slot's ``bin/``, as
    cloud-init puts them on an instance before anything runs there: the slot's interruption
    watcher runs them from the start (a deploy later writes the same files there)."""
    root = host_root(host)
    config = render_agent_config(
        settings,
        iam.pool_of_host(settings, host),
        host=host.name,
        root=str(root),
        python=sys.executable,
        address=host.address,
    )
    files = {**frontier_hostside.agent_files(), AGENT_CONFIG_NAME: config.encode()}
    for name, data in files.items():
        path = root / "bin" / name
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o755 if name == AGENT_FILE_NAME else 0o644)
        tmp.replace(path)


def imds_service(host: Host) -> str:
    """The name of ``host``'s IMDS stand-in among the stack's services."""
    return f"imds-{host.name}"


def watcher_service(host: Host) -> str:
    """The name of ``host``'s interruption watcher (the agent's ``interruptions``) among the services."""
    return f"interruptions-{host.name}"


def instance_id(settings: Settings, host: Host) -> str:
    """The EC2-shaped instance id ``host``'s IMDS gives (``i-`` and 17 hex digits), the same on every ``up``."""
    return "i-" + hashlib.sha256(f"{settings.stack}/{host.name}".encode()).hexdigest()[:17]


def _up_interruptions(settings: Settings, host: Host, state: Path) -> list[Component]:
    """``host``'s IMDS stand-in, then the agent's watcher polling it (restarted when the stack file
    changed what it is told: the gateway to tell)."""
    report = []
    stand_in = services.find(state, imds_service(host))
    if stand_in is None:
        port = services.free_port(host.address)
        group = iam.pool_of_host(settings, host).group
        command = [
            # Run as a script: it is standard library only, so it starts without the toolkit's imports.
            *(sys.executable, imds.__file__, "--address", host.address, "--port", str(port)),
            *("--instance-id", instance_id(settings, host), "--instance-type", group.instance_type),
            *("--availability-zone", f"{settings.region}a"),
        ]
        log = state / "imds" / f"{host.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        stand_in = services.spawn(imds_service(host), command, state, log, host.address, port)
        services.wait_for_port(host.address, port, 20, stand_in)
        report.append(Component(imds_service(host), "started", f"{stand_in.endpoint} (pid {stand_in.pid})"))
    else:
        report.append(Component(imds_service(host), "running", f"{stand_in.endpoint} (pid {stand_in.pid})"))
    bin_dir = host_root(host) / "bin"
    command = [
        *(sys.executable, str(bin_dir / AGENT_FILE_NAME), "--config", str(bin_dir / AGENT_CONFIG_NAME)),
        *("interruptions", "--imds", stand_in.endpoint, "--interval", f"{IMDS_POLL_S:g}"),
    ]
    if settings.gateway is not None:
        # The gateway's admin port is on this machine: it hears of a notice before the drain starts.
        command += ["--gateway-admin", f"http://{settings.gateway.admin_host}:{settings.gateway.admin_port}"]
    name = watcher_service(host)
    watcher = services.find(state, name)
    if watcher is not None and watcher.command == command:
        report.append(Component(name, "running", f"polls {stand_in.endpoint} (pid {watcher.pid})"))
        return report
    if watcher is not None:
        services.stop(watcher)
    log = host_root(host) / "logs" / "interruptions.log"
    watcher = services.spawn(name, command, state, log, host.address, 0)
    every = f"every {IMDS_POLL_S:g} s"
    report.append(Component(name, "started", f"polls {stand_in.endpoint} {every} (pid {watcher.pid})"))
    return report


def _up_sshd(settings: Settings, host: Host, state: Path, public_key: str) -> Component:
    name = f"sshd-{host.name}"
    running = services.find(state, name)
    where = f"{settings.inventory.ssh_user}@{host.address}:{host.ssh_port}"
    wanted = host_env(settings, host)
    if running is not None:
        if services.sshd_session_env(state, name) == wanted:
            return Component(name, "running", f"{where} (pid {running.pid})")
        # The slot's sessions hand out another key now (the stack file moved it to another pool,
        # or lists its models): a session must sign as the slot's pool's principal.
        services.stop(running)
    service = services.start_sshd(host.address, host.ssh_port, state, public_key, name=name, set_env=wanted)
    return Component(name, "started" if running is None else "restarted", f"{where} (pid {service.pid})")


def host_slots(settings: Settings) -> list[Component]:
    """Each host slot's env file and SSH sessions, with its pool's key: run after :func:`identities`
    when the stack file changes which pool a slot serves (a one-model stack turned into pools)."""
    state = state_dir(settings)
    report = []
    for host in settings.inventory.hosts:
        report.append(_prepare_host(settings, host))
        if services.find(state, f"sshd-{host.name}") is not None:
            report.append(_up_sshd(settings, host, state, _ensure_ssh_key(settings)))
    return report


def haproxy_config_path(settings: Settings) -> Path:
    return state_dir(settings) / "haproxy" / "haproxy.cfg"


def render_balancer_config(settings: Settings) -> str:
    """The local balancer's haproxy.cfg, rendered from the stack (backends = the host slots)."""
    local = require_local(settings)
    return render_haproxy(
        settings,
        balancer_backends(settings),
        bind_port=local.balancer_port,
        stats_socket=str(admin_socket(settings)),
        stats_port=local.balancer_stats_port,
    )


def _up_haproxy(settings: Settings, state: Path) -> Component:
    local = require_local(settings)
    config = haproxy_config_path(settings)
    running = services.find(state, "haproxy")
    if running is not None:
        detail = f"{balancer_url(settings)} (pid {running.pid})"
        if not config.exists() or config.read_text() != render_balancer_config(settings):
            detail += (
                "; its config differs from the stack file: `fab local.down` then `fab local.up` to apply it"
            )
        return Component("haproxy", "running", detail)
    config.parent.mkdir(parents=True, exist_ok=True)
    admin_socket(settings).unlink(missing_ok=True)
    config.write_text(render_balancer_config(settings))
    service = services.start_haproxy(config, state)
    stats = f"http://127.0.0.1:{local.balancer_stats_port}/stats"
    return Component("haproxy", "started", f"{balancer_url(settings)} (pid {service.pid}); stats {stats}")


def _up_alarms(settings: Settings, state: Path) -> Component:
    """The alarm evaluator (:mod:`frontier.targets.local.alarms`): CloudWatch's part on this machine."""
    running = services.find(state, "alarms")
    if running is not None:
        return Component("alarms", "running", f"pid {running.pid}")
    command = [
        *(sys.executable, "-m", "frontier.targets.local.alarms"),
        *("--stack", settings.stack, "--stack-file", settings.source),
    ]
    service = services.spawn("alarms", command, state, state / "alarms.log", "127.0.0.1", 0)
    every = settings.alerts.evaluation_interval_s
    return Component("alarms", "started", f"pid {service.pid}: every {every:g} s, to SNS topics per severity")


def _up_traces(settings: Settings, state: Path) -> Component:
    """The trace receiver that stands in for an OpenTelemetry Collector on this machine."""
    running = services.find(state, traces.SERVICE)
    if running is not None:
        return Component(traces.SERVICE, "running", f"pid {running.pid}")
    out = state / traces.SPANS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    # A free port, not OTLP's 4318: several local stacks (the e2e tests') run side by side. Never one
    # the stack's own services will listen on later in this `up` (free now, taken in a moment).
    port = services.free_port("127.0.0.1")
    while port in _stack_ports(settings):
        port = services.free_port("127.0.0.1")
    command = [
        *(sys.executable, "-m", "frontier.targets.local.traces"),
        *("--port", str(port), "--out", str(out)),
    ]
    log = state / "traces" / "receiver.log"
    service = services.spawn(traces.SERVICE, command, state, log, "127.0.0.1", port)
    services.wait_for_port("127.0.0.1", port, 20, service)
    return Component(traces.SERVICE, "started", f"{traces.endpoint(port=port)} (pid {service.pid}) → {out}")


def _stack_ports(settings: Settings) -> set[int]:
    """Every port the stack file names for a service of this machine."""
    local = require_local(settings)
    ports = {local.moto_port, local.balancer_port, local.balancer_stats_port}
    ports |= {pool.runtime.port for pool in settings.pools}
    ports |= {h.ssh_port for h in settings.inventory.hosts}
    if settings.gateway is not None:
        ports |= {settings.gateway.port, settings.gateway.admin_port}
    return ports


def traces_env(settings: Settings) -> dict[str, str]:
    """What a process of this stack needs in its environment to send its spans to the stack's
    receiver; nothing while none runs (tracing then stays off)."""
    receiver = services.find(state_dir(settings), traces.SERVICE)
    return traces.environment(receiver.port) if receiver is not None else {}


def _write_state(settings: Settings, state: Path, connection: str) -> None:
    data = {
        "stack": settings.stack,
        "connection": connection,
        "moto": moto_endpoint(settings),
        "balancer": balancer_url(settings),
        "admin_socket": str(admin_socket(settings)),
        "hosts": {
            h.name: {"address": h.address, "ssh_port": h.ssh_port, "root": str(host_root(h))}
            for h in settings.inventory.hosts
        },
    }
    (state / STATE_FILE).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# --- down -----------------------------------------------------------------------------------------


def down(settings: Settings) -> list[Component]:
    """Stop everything ``up`` started and any runtime still running on a host slot. Idempotent."""
    state = state_dir(settings)
    report = _stop_runtimes(settings.inventory.hosts)
    names = [
        *("alarms", "gateway", traces.SERVICE, "haproxy"),
        *(watcher_service(h) for h in settings.inventory.hosts),
        *(imds_service(h) for h in settings.inventory.hosts),
        *(f"sshd-{h.name}" for h in settings.inventory.hosts),
        "moto",
    ]
    for name in names:
        service = services.find(state, name) if state.exists() else None
        if service is None:
            report.append(Component(name, "absent", "not running"))
            continue
        services.stop(service)
        report.append(Component(name, "stopped", f"pid {service.pid}"))
    # A daemon found absent above may have been recorded while the others were stopping (one that
    # `up` had only just spawned): a second look stops it too, so a second `down` finds nothing.
    for index, component in enumerate(report):
        late = (
            services.find(state, component.name) if component.state == "absent" and state.exists() else None
        )
        if late is not None:
            services.stop(late)
            report[index] = Component(component.name, "stopped", f"pid {late.pid}")
    (state / STATE_FILE).unlink(missing_ok=True)
    # moto's users went with it; the next `up` makes new ones.
    iam.credentials_file(state).unlink(missing_ok=True)
    # The next `up` starts with the stack's desired_size in service again.
    (state / GROUP_STATE_FILE).unlink(missing_ok=True)
    return report


def _stop_runtimes(hosts: tuple[Host, ...], timeout: float = 15.0) -> list[Component]:
    """Stop every process with a pid file under a slot's ``run/``, all at once (each drains on
    SIGTERM; SIGKILL after ``timeout``); then clear ``run/`` so no slot claims to run a release."""
    found: list[tuple[Host, str, int]] = []
    for host in hosts:
        run = host_root(host) / "run"
        for pid_file in sorted(run.glob("*.pid")) if run.exists() else []:
            with contextlib.suppress(ValueError, IndexError, OSError):
                pid = int(pid_file.read_text().split()[0])
                if services.pid_alive(pid):
                    found.append((host, pid_file.stem, pid))
    # Supervisors first (each stops its runtime), so none sees its runtime exit and restarts it.
    supervisors = [item for item in found if f"{item[1]}.pid" == SUPERVISOR_PID_NAME]
    found = supervisors + [item for item in found if item not in supervisors]
    outcomes: list[str] = []
    for batch in (found[: len(supervisors)], found[len(supervisors) :]):
        if batch:
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                outcomes += pool.map(lambda item: terminate_then_kill(item[2], timeout), batch)
    for host in hosts:
        run = host_root(host) / "run"
        for leftover in run.iterdir() if run.exists() else []:
            if leftover.is_file():
                leftover.unlink(missing_ok=True)
    supervised = {host.name for host, _, _ in supervisors}
    return [
        Component(
            f"{host.name} {name}",
            "stopped",
            f"pid {pid} (stopped by its supervisor)"
            if outcome == "absent" and host.name in supervised
            else f"pid {pid} ({outcome})",
        )
        for (host, name, pid), outcome in zip(found, outcomes, strict=True)
    ]
