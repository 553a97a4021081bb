"""A small real cluster on this machine for the operate tests and the rollout bench.

Every part is real: one sshd per host on a loopback alias (127.0.1.x:2222, generated keys), HAProxy
from the stack's rendered config with its admin socket, moto's server (in-process) for S3, Secrets
Manager and ELBv2, and the runtime started from staged wheels by the rollout itself. The stack file
is a copy of ``stacks/Pulumi.local.yaml`` pointed at these addresses, ports and directories.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from frontier_hostside.names import AGENT_FILE_NAME

from frontier import project
from frontier.config.schema import Settings
from frontier.hosts.inventory import HostSpec, static_hosts
from frontier.release.artifact import Artifact, build_wheel
from frontier.release.history import HistoryStore
from frontier.rollout.deploy import deploy
from frontier.targets import Backend, backend_for, load_stack
from frontier.targets.local import services
from frontier.targets.local.balancer import render_haproxy

ADDRESSES = [f"127.0.1.{i}" for i in range(2, 10)]
SSH_PORT = 2222
API_KEY = "operate-test-key"


def write_stack(
    base: Path,
    addresses: list[str],
    moto_port: int,
    changes: dict[str, Any] | None = None,
    group: dict[str, Any] | None = None,
) -> Path:
    """A copy of the local stack whose hosts, ports and directories are this cluster's.

    Every slot serves unless ``group`` says otherwise (``min_size``, ``desired_size``, ``max_size``).
    """
    document = yaml.safe_load(((project.root() / "stacks") / "Pulumi.local.yaml").read_text())
    config = document["config"]
    runtime_port = _free_on_all(addresses)
    config["frontier:inventory"].update(
        ssh_key_file=str(base / "ssh" / "id_ed25519"),
        hosts=[
            {
                "name": f"host-{i + 1}",
                "address": a,
                "ssh_port": SSH_PORT,
                "root": str(base / "hosts" / f"host-{i + 1}"),
            }
            for i, a in enumerate(addresses)
        ],
    )
    node_group = config["frontier:node_groups"][0]
    node_group.update(min_size=len(addresses), desired_size=len(addresses), max_size=len(addresses))
    node_group.update(group or {})
    config["frontier:runtime"]["port"] = runtime_port
    # One canary, then the other hosts together: both rollout steps are exercised.
    config["frontier:rollout"].update(
        deregistration_delay_s=2,
        readiness_timeout_s=90,
        canary_hosts=1,
        batch_size=max(1, len(addresses) - 1),
    )
    config["frontier:rollout"]["gate"].update(window_s=0.5)
    config["frontier:health"].update(interval_s=1, healthy_threshold=1)
    config["frontier:local"].update(
        state_dir=str(base / "state"),
        moto_port=moto_port,
        balancer_port=services.free_port(),
        balancer_stats_port=services.free_port(),
    )
    for key, value in (changes or {}).items():
        section, _, field_name = key.partition(".")
        target = config[f"frontier:{section}"]
        *parents, leaf = field_name.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    path = base / "stacks" / "Pulumi.local.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _free_on_all(addresses: list[str]) -> int:
    while True:
        port = services.free_port(addresses[0])
        if not any(services.port_in_use(a, port) for a in addresses):
            return port


@dataclass
class Cluster:
    base: Path
    stack_file: Path
    settings: Settings
    moto: services.Service
    haproxy: services.Service
    sshd: dict[str, services.Service] = field(default_factory=dict)
    public_key: str = ""

    @property
    def hosts(self) -> list[HostSpec]:
        """The slots in service (what a rollout goes over)."""
        return backend_for(self.settings).hosts()

    @property
    def slots(self) -> list[HostSpec]:
        """Every host slot of the stack, serving or spare."""
        return static_hosts(
            self.settings, self.settings.serving_group.name, python=sys.executable, resolve_root=str
        )

    @property
    def endpoint(self) -> str:
        return self.moto.endpoint

    def variant(self, name: str, changes: dict[str, Any]) -> Settings:
        """This cluster's settings with some changed (a copy of the stack file; the base stays)."""
        document = yaml.safe_load(self.stack_file.read_text())
        config = document["config"]
        for key, value in changes.items():
            section, _, field_name = key.partition(".")
            target = config[f"frontier:{section}"]
            *parents, leaf = field_name.split(".")
            for parent in parents:
                target = target[parent]
            target[leaf] = value
        path = self.base / "variants" / name / "Pulumi.local.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return load_stack("local", path=path)

    def store(self) -> HistoryStore:
        return backend_for(self.settings).history_store()

    def backend(self, settings: Settings | None = None) -> Backend:
        """The stack's backend (these settings, or a variant's): what ``fab deploy`` rolls through."""
        return backend_for(settings or self.settings)

    def kill_sshd(self, host_name: str) -> None:
        services.stop(self.sshd.pop(host_name), timeout=5)

    def start_sshd(self, host: HostSpec) -> None:
        self.sshd[host.name] = services.start_sshd(
            host.address, host.ssh_port, self.base / "state", self.public_key, name=f"sshd-{host.name}"
        )

    def host_file(self, host: HostSpec, rel: str) -> bytes:
        return (Path(host.root) / rel).read_bytes()

    def stop(self) -> None:
        # The runtimes stop together (each drains on SIGTERM), then the daemons.
        stopping = [
            subprocess.Popen(
                [h.python, str(Path(h.root) / "bin" / AGENT_FILE_NAME), "stop"], stdout=subprocess.DEVNULL
            )
            for h in self.slots
            if (Path(h.root) / "run" / "runtime.pid").exists()
        ]
        for process in stopping:
            process.wait()
        for service in [*self.sshd.values(), self.haproxy, self.moto]:
            services.stop(service, timeout=5)


def start_cluster(
    base: Path, count: int = 3, changes: dict[str, Any] | None = None, group: dict[str, Any] | None = None
) -> Cluster:
    base.mkdir(parents=True, exist_ok=True)
    moto = services.start_moto(0, base / "state", in_process=True)
    started: list[services.Service] = [moto]
    try:
        addresses = ADDRESSES[:count]
        stack_file = write_stack(base, addresses, moto.port, changes, group)
        settings = load_stack("local", path=stack_file)
        key = base / "ssh" / "id_ed25519"
        key.parent.mkdir(parents=True, exist_ok=True)
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        public_key = key.with_suffix(".pub").read_text()
        cfg = base / "state" / "haproxy.cfg"
        backends = [(h.name, h.address, settings.runtime.port) for h in settings.inventory.hosts]
        cfg.write_text(
            render_haproxy(
                settings,
                backends,
                bind_port=settings.local.balancer_port,
                stats_socket=backend_for(settings).admin_socket(),
            )
        )
        haproxy = services.start_haproxy(cfg, base / "state")
        started.append(haproxy)
        cluster = Cluster(base, stack_file, settings, moto, haproxy, public_key=public_key)
        for host in cluster.slots:
            cluster.start_sshd(host)
            started.append(cluster.sshd[host.name])
            _prepare_host(host, moto.endpoint)
        _prepare_aws(cluster)
        return cluster
    except BaseException:
        for service in reversed(started):
            services.stop(service, timeout=5)
        raise


@contextlib.contextmanager
def deployed_cluster(
    base: Path,
    count: int,
    model_dir: Path,
    changes: dict[str, Any],
    group: dict[str, Any] | None = None,
) -> Iterator[Cluster]:
    """A cluster with the tiny model pushed and the runtime deployed on the slots in service.

    moto's in-process state is shared by every cluster of a test process: give ``changes`` an
    API-key secret of the cluster's own (``runtime.api_keys_secret``); the state is reset at the end.
    """
    cluster = start_cluster(base, count, changes, group)
    try:
        push_model(cluster, model_dir)
        result = deploy(cluster.backend(), register_wheel(cluster, cache=base / "artifacts").digest)
        assert result.outcome == "succeeded", result
        yield cluster
    finally:
        reset = urllib.request.Request(f"{cluster.endpoint}/moto-api/reset", method="POST")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(reset, timeout=5).close()
        cluster.stop()


def _prepare_host(host: HostSpec, endpoint: str) -> None:
    root = Path(host.root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "env").write_text(
        f"AWS_ENDPOINT_URL={endpoint}\nAWS_ACCESS_KEY_ID=testing\nAWS_SECRET_ACCESS_KEY=testing\n"
        "AWS_DEFAULT_REGION=us-east-1\nPYTHONDONTWRITEBYTECODE=1\n"
    )


def _prepare_aws(cluster: Cluster) -> None:
    secrets = backend_for(cluster.settings).aws_client("secretsmanager")
    secrets.create_secret(
        Name=cluster.settings.runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
    )


def push_model(cluster: Cluster, model_dir: Path) -> None:
    from frontier.release import weights

    s = cluster.settings
    weights.push(
        backend_for(s).aws_client("s3"),
        model_dir,
        s.model.weights_uri,
        s.model.name,
        s.model.version,
        create_bucket=True,
    )


def register_wheel(cluster: Cluster, source: Path | None = None, cache: Path | None = None) -> Artifact:
    """Build the runtime wheel and register it in the stack's history bucket (what release.build does)."""
    kwargs: dict[str, Any] = {}
    if source is not None:
        kwargs["source_dir"] = source
    if cache is not None:
        kwargs["cache_dir"] = cache
    artifact, path = build_wheel(**kwargs)
    cluster.store().put_artifact(artifact, path)
    return artifact


def make_tiny_model(out: Path) -> Path:
    if not (out / "model.safetensors").exists():
        subprocess.run(
            [sys.executable, "-m", "frontier_runtime.tiny", "--out", str(out)],
            check=True,
            capture_output=True,
        )
    return out
