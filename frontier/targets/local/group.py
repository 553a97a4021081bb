"""The local stand-in for an auto scaling group: which host slots serve, and how one joins or leaves.

The stack's ``inventory.hosts`` are the slots a pool's node group may use (those the pool lists and
the spare ones no pool lists: a one-model stack's every slot); ``min_size``,
``desired_size`` and ``max_size`` of that group bound how many are *in service*. Which ones are is
kept in ``<state_dir>/group.json`` (first ``desired_size`` slots until something changes it), so
``deploy``, ``rollback``, ``status`` and the load test see the same fleet a cloud stack's group
would show them.

A **launch** does on a slot what an EC2 launch does on a new instance, with the same code:
the host tools (the agent, its configuration template and the bootstrap) are fetched from the
history bucket into ``<root>/bin`` — cloud-init's copy — and ``bootstrap.py boot`` runs *on the
slot* (over its SSH or local connection) with a ``node.env`` like the one cloud-init writes. It
reads the stack's current good release from the history, verifies and starts it, and waits for
readiness; only then is the slot in service, and HAProxy (which lists every slot, with active
health checks) puts it in rotation. A slot that cannot serve is left out, with the bootstrap's
reason.

A **retire** does what the terminate lifecycle hook does: the slot leaves the group first (no
rollout picks it), HAProxy drains it (no new requests; in-flight ones finish), then the host agent
stops the runtime, which drains what is left. No request is cut.

:class:`LocalFleet` has the shape of :class:`frontier.targets.ec2.group.AsgFleet` (``size``, ``scale``,
``grow``, ``retire``, ``hold``), so ``fab scale`` and the local autoscaler drive it the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import frontier_hostside
from frontier_hostside.names import (
    AGENT_CONFIG_NAME,
    BOOTSTRAP_FILE_NAME,
    HOST_TOOLS_PREFIX,
    METRICS_PATH,
    PLACEHOLDER_ADDRESS,
    PLACEHOLDER_HOST,
)

from frontier import project
from frontier.config.schema import Host, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec, static_hosts
from frontier.hosts.session import HostSession
from frontier.release.history import HistoryStore
from frontier.render.boot import node_env
from frontier.render.host import render_agent_config
from frontier.rollout.strategy import GroupSize

STATE_FILE = "group.json"
NODE_ENV = "node.env"
EVENTS_KEPT = 50


class GroupError(FrontierError):
    """A size out of range, no spare slot, or a slot that could not start the current release."""


@dataclass(frozen=True)
class Activity:
    """One launch or retire, as the group's activity history shows it."""

    at: str
    action: str  # launch | retire | warm
    host: str
    outcome: str  # in_service | failed | retired | warmed
    seconds: float
    detail: str


@dataclass
class GroupState:
    in_service: list[str]
    protected: list[str] = field(default_factory=list)
    activities: list[dict] = field(default_factory=list)
    # Spare slots whose weights cache holds what the current release's start reads (``warm``): a
    # launch takes these first.
    warm: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Launched:
    host: HostSpec
    release: str
    boot_s: float  # the bootstrap on the slot: fetch, verify, start, readiness
    in_rotation_s: float  # from the launch to HAProxy's health check passing


@dataclass(frozen=True)
class Warmed:
    """A spare slot warmed for a release: staged, its weights cache filled, not in service."""

    host: HostSpec
    release: str
    seconds: float
    bytes_fetched: int
    #: What was fetched was the prepared weights of the release's key (else the checkpoint).
    prepared: bool


# --- the in-service set ---------------------------------------------------------------------------


def read_state(settings: Settings, state_dir: Path) -> GroupState:
    """The stack's group state file; before any launch or retire, the first ``desired_size`` slots
    of each pool (:func:`pool_slots`, its group's ``desired_size``) serve."""
    try:
        return GroupState(**json.loads((state_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        names = [
            host.name
            for pool in settings.pools
            for host in pool_slots(settings, pool)[: pool.group.desired_size]
        ]
        return GroupState(in_service=list(dict.fromkeys(names)))


def pool_slots(settings: Settings, pool: PoolSettings) -> list[Host]:
    """The host slots ``pool``'s group may use, in the stack's order: those the pool lists, and the
    spare slots no pool lists (a one-model stack's pool, or a one-pool view's, has every slot)."""
    listed = {host.name for other in settings.pools for host in other.hosts}
    own = {host.name for host in pool.hosts}
    return [host for host in settings.inventory.hosts if host.name in own or host.name not in listed]


def slot_specs(settings: Settings, pool: PoolSettings, group: str | None = None) -> list[HostSpec]:
    """:func:`pool_slots` as the hosts a task reaches (of node group ``group``, default the pool's)."""
    names = {host.name for host in pool_slots(settings, pool)}
    specs = static_hosts(
        settings,
        group or pool.group.name,
        python=sys.executable,
        resolve_root=lambda p: str(project.resolve(p)),
    )
    return [spec for spec in specs if spec.name in names]


class LocalFleet:
    """The node group of ``pool``, one pool of a local stack, as an auto scaling group of host slots."""

    def __init__(
        self,
        settings: Settings,
        pool: PoolSettings,
        history: Callable[[], HistoryStore],
        balancer: Balancer,
        connect: Callable[[HostSpec], object],
        *,
        state_dir: Path,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        # The pool this fleet's slots boot (a stack of several models runs a fleet per pool).
        self.pool = pool
        self.group = self.pool.group
        self.name = f"{settings.stack}-{self.group.name}"
        # The history (moto's S3) is reached only when a slot launches: sizes and refusals need none.
        self._history = history
        self.balancer = balancer
        self.connect = connect
        self.state_path = state_dir / STATE_FILE
        self.say = say or (lambda _line: None)

    # The pool's slots and the spare ones, in the order the stack lists them.
    def slots(self) -> list[HostSpec]:
        return slot_specs(self.settings, self.pool)

    def _read(self) -> GroupState:
        return read_state(self.settings, self.state_path.parent)

    def _write(self, state: GroupState) -> None:
        state.activities = state.activities[-EVENTS_KEPT:]
        tmp = self.state_path.with_name(f".{STATE_FILE}.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
        tmp.replace(self.state_path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[GroupState]:
        """The state, read and written back under a file lock (the autoscaler and `fab` may race)."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.state_path.with_name(f".{STATE_FILE}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._read()
            yield state
            self._write(state)

    def in_service(self) -> set[str]:
        # The state file is the stack's; the fleet of one pool counts its own slots (and the spares).
        return set(self._read().in_service) & {h.name for h in self.slots()}

    def serving(self) -> list[HostSpec]:
        """The in-service slots, in the stack's order (the rollout order)."""
        names = self.in_service()
        return [h for h in self.slots() if h.name in names]

    def spares(self) -> list[HostSpec]:
        """The slots out of service, the warm ones (``warm``) first."""
        names = self.in_service()
        warm = set(self._read().warm)
        spare = [h for h in self.slots() if h.name not in names]
        return [h for h in spare if h.name in warm] + [h for h in spare if h.name not in warm]

    def size(self) -> GroupSize:
        return GroupSize(self.group.min_size, len(self.in_service()), self.group.max_size)

    def activities(self) -> list[Activity]:
        return [Activity(**a) for a in self._read().activities]

    def _note(self, state: GroupState, activity: Activity) -> None:
        state.activities.append(asdict(activity))
        self.say(
            f"{activity.action} {activity.host}: {activity.outcome} in {activity.seconds:.1f}s ({activity.detail})"
        )

    # --- scaling ----------------------------------------------------------------------------------

    def scale(self, replicas: int) -> GroupSize:
        """Launch or retire slots until ``replicas`` serve; out of min..max is refused, nothing changes."""
        size = self.size()
        if not size.min_size <= replicas <= size.max_size:
            raise GroupError(
                f"--replicas {replicas}: the group {self.name} of stack {self.settings.stack!r} scales between "
                f"min_size {size.min_size} and max_size {size.max_size} (node_groups[].min_size / max_size)"
            )
        if replicas > size.desired:
            self.grow(replicas - size.desired, self.settings.rollout.readiness_timeout_s + 60)
        elif replicas < size.desired:
            self.shrink(size.desired - replicas)
        return self.size()

    def grow(self, count: int, timeout_s: float) -> list[HostSpec]:
        """``count`` spare slots launched one after another; returned once in rotation."""
        size = self.size()
        if size.desired + count > size.max_size:
            raise GroupError(f"{self.name}: {size.desired} + {count} hosts exceed max_size {size.max_size}")
        spares = self.spares()
        if len(spares) < count:
            raise GroupError(
                f"{self.name}: {count} more host(s) asked for, {len(spares)} spare slot(s) in inventory.hosts"
            )
        return [self.launch(host, timeout_s).host for host in spares[:count]]

    def shrink(self, count: int) -> list[HostSpec]:
        """Retire ``count`` slots, the most recently listed unprotected ones first."""
        state = self._read()
        candidates = [h for h in reversed(self.serving()) if h.name not in state.protected]
        if len(candidates) < count:
            raise GroupError(
                f"{self.name}: {count} host(s) to retire, {len(candidates)} not protected by a rollout"
            )
        chosen = candidates[:count]
        self.retire(chosen)
        return chosen

    @contextlib.contextmanager
    def hold(self, hosts: list[HostSpec]) -> Iterator[None]:
        """While a rollout runs, its hosts are protected from scale-in (as the ASG's instance protection)."""
        with self._locked() as state:
            state.protected = sorted(set(state.protected) | {h.name for h in hosts})
        try:
            yield
        finally:
            with self._locked() as state:
                state.protected = sorted(set(state.protected) - {h.name for h in hosts})

    # --- one slot -------------------------------------------------------------------------------------

    def launch(self, host: HostSpec, timeout_s: float) -> Launched:
        """Boot ``host`` from the history as a new instance would; in rotation when it returns."""
        started = time.perf_counter()
        if host.name in self.in_service():
            raise GroupError(f"{self.name}: {host.name} is already in service")
        self.say(f"launch {host.name}: fetching the host tools, then `bootstrap boot` on the slot")
        try:
            answer = self._bootstrap(host, timeout_s, "boot")
            if not answer.get("ok"):
                raise GroupError(
                    f"{host.name} abandoned its launch: {answer.get('reason') or answer.get('error')}"
                )
            if not answer.get("release"):
                raise GroupError(f"{host.name}: {answer.get('reason')}")
            boot_s = time.perf_counter() - started
            with self._locked() as state:
                # Other pools' slots (not in this fleet's slots) stay in service as they were.
                state.in_service = [n for n in state.in_service if n != host.name] + [host.name]
                state.warm = [n for n in state.warm if n != host.name]
            # A slot retired earlier is in maintenance in HAProxy: back to ready; the health check
            # (already passing) puts it in rotation.
            self.balancer.enable(host, timeout=max(10.0, self.settings.health.interval_s * 10))
        except (GroupError, FrontierError, OSError) as exc:
            with self._locked() as state:
                state.in_service = [n for n in state.in_service if n != host.name]
                self._note(state, _activity("launch", host.name, "failed", started, str(exc)))
            raise GroupError(str(exc)) from exc
        launched = Launched(host, answer["release"], boot_s, time.perf_counter() - started)
        with self._locked() as state:
            self._note(
                state,
                _activity(
                    "launch", host.name, "in_service", started, f"{answer['reason']}; booted in {boot_s:.1f}s"
                ),
            )
        return launched

    def warm(self, timeout_s: float) -> Warmed | None:
        """Warm the first spare slot for the current release and leave it out of service: what a
        replacement does on a rebalance recommendation, before the host at risk goes (``bootstrap
        prefetch``: release staged, weights cache filled with what its start reads). None when no
        spare slot is left; a spare already warm is warmed again (the release may have changed)."""
        spares = self.spares()
        if not spares:
            return None
        host = spares[0]
        started = time.perf_counter()
        self.say(f"warm {host.name}: fetching the host tools, then `bootstrap prefetch` on the slot")
        answer = self._bootstrap(host, timeout_s, "prefetch")
        warmed = bool(answer.get("ok"))
        fetched = answer.get("prefetch", {})
        what = "prepared weights" if fetched.get("prepared") else "weights"
        detail = (
            f"{fetched.get('bytes_downloaded', 0)} bytes of {what} fetched for {answer.get('release')}"
            if warmed
            else str(answer.get("reason") or answer.get("error"))
        )
        with self._locked() as state:
            state.warm = [n for n in state.warm if n != host.name] + ([host.name] if warmed else [])
            self._note(state, _activity("warm", host.name, "warmed" if warmed else "failed", started, detail))
        if not warmed:
            raise GroupError(f"{host.name} could not be warmed: {detail}")
        return Warmed(
            host,
            str(answer["release"]),
            time.perf_counter() - started,
            int(fetched.get("bytes_downloaded", 0)),
            bool(fetched.get("prepared")),
        )

    def retire(self, hosts: list[HostSpec]) -> None:
        """Take each host out of the group, drain it in the balancer, then stop its runtime."""
        for host in hosts:
            started = time.perf_counter()
            with self._locked() as state:
                if host.name in state.protected:
                    raise GroupError(f"{self.name}: {host.name} is protected by a rollout in progress")
                state.in_service = [n for n in state.in_service if n != host.name]
            left = self.balancer.drain(
                host, timeout=max(1.0, self.settings.rollout.deregistration_delay_s) + 30
            )
            session = HostSession(self.settings, self.pool, host, self.connect(host))
            try:
                stopped = session.stop()
            finally:
                session.close()
            detail = f"drained ({left} session(s) open at the deadline), runtime {stopped}"
            with self._locked() as state:
                self._note(state, _activity("retire", host.name, "retired", started, detail))

    def _bootstrap(self, host: HostSpec, timeout_s: float, command: str) -> dict:
        """cloud-init's part on the slot: host tools from the bucket, node.env, then the bootstrap's
        ``command`` (``boot``, or ``prefetch`` for a warm spare)."""
        root = Path(host.root)
        for sub in ("bin", "logs", "run", "releases"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # `pulumi up` uploads the host tools of a cloud stack; here this checkout's are the truth.
        store = self._history()
        prefix = f"{store.prefix}{HOST_TOOLS_PREFIX}{self.group.name}/"
        for key in publish_host_tools(self.settings, self.pool, store):
            # Laid out as cloud-init's `aws s3 cp --recursive` lays them out (frontier_hostside/ a folder).
            path = root / "bin" / key[len(prefix) :]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(store.s3.get_object(Bucket=store.bucket, Key=key)["Body"].read())
        env = dict(
            node_env(self.settings, self.pool, history_bucket=store.bucket, history_prefix=store.prefix)
        )
        env |= {
            "FRONTIER_ROOT": str(root),
            "FRONTIER_INSTANCE_ID": host.name,
            "FRONTIER_ADDRESS": host.address,
            "FRONTIER_METRICS_URL": f"http://{host.address}:{self.pool.runtime.port}{METRICS_PATH}",
            "FRONTIER_READINESS_TIMEOUT_S": str(int(timeout_s)),
            # A pool of a stack of several models boots from its own history, the wheel from the stack's.
            "FRONTIER_ARTIFACTS_PREFIX": store.artifacts_prefix,
        }
        (root / NODE_ENV).write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        # The slot's env file points the AWS CLI at the stack's moto, as the instance profile would.
        command = (
            f"cd {shlex.quote(str(root))} && set -a && . ./env && set +a && "
            f"exec {shlex.quote(host.python)} bin/{BOOTSTRAP_FILE_NAME} --env {NODE_ENV} {command}"
        )
        conn = self.connect(host)
        try:
            result = conn.run(command, hide=True, warn=True, in_stream=False, timeout=timeout_s + 120)
        finally:
            conn.close()
        with (root / "logs" / "bootstrap.log").open("a") as log:
            log.write(result.stderr)
        for line in reversed(result.stdout.strip().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise GroupError(
            f"{host.name}: the bootstrap answered nothing (exit {result.return_code}): {result.stderr[-500:]}"
        )


def publish_host_tools(settings: Settings, pool: PoolSettings, store: HistoryStore) -> list[str]:
    """Upload the agent, the bootstrap, the names they import and ``pool``'s agent configuration
    template under ``host/<group>/`` of the history prefix (its group's): on EC2 Pulumi does this; on
    the local stack ``local.up`` and each deploy do. The keys uploaded."""
    keys = []
    group = pool.group
    prefix = f"{store.prefix}{HOST_TOOLS_PREFIX}{group.name}/"
    template = render_agent_config(
        settings,
        pool,
        host=PLACEHOLDER_HOST,
        root="/",
        python=sys.executable,
        address=PLACEHOLDER_ADDRESS,
    )
    files = {**frontier_hostside.host_tools(), AGENT_CONFIG_NAME: template.encode()}
    for name, body in files.items():
        store.s3.put_object(Bucket=store.bucket, Key=prefix + name, Body=body)
        keys.append(prefix + name)
    return keys


def _activity(action: str, host: str, outcome: str, started: float, detail: str) -> Activity:
    return Activity(
        at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        action=action,
        host=host,
        outcome=outcome,
        seconds=round(time.perf_counter() - started, 2),
        detail=detail,
    )
