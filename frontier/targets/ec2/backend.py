"""EC2: hosts found by their tags, reached over SSH, drained through the ALB target group (behind a
gateway: by the runtime's own drain, :mod:`frontier.hosts.gateway_fronted`).

SSH reaches a host through Session Manager, or the stack's bastion, with a key of this run that EC2
Instance Connect delivers to the host right before each connection (:mod:`frontier.targets.ec2.access`).

Bucket names, the target group and the endpoint come from the Pulumi stack outputs saved under
``.frontier/outputs/<stack>.json`` (:class:`frontier.config.outputs.Ec2Outputs`, see :mod:`frontier.aws`).

The node group is an auto scaling group (:class:`~frontier.targets.ec2.group.AsgFleet`, found by
its tags): a rollout surges where its ``max_size`` leaves room and holds the group while it runs.
A group whose replica spans several nodes rolls in place, its hosts in replica order, a wave of
whole replicas at a time (:mod:`frontier.targets.ec2.replicas`).
A stack that lists its hosts (``inventory.source: static``) is a fixed fleet: no group, in place.
A disaggregated pool's two groups roll as a pair, prefill first (:mod:`frontier.targets.ec2.pair_roll`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from frontier_hostside.names import DEPLOYING_POINTER, HOST_ROOT
from frontier_settings import FieldProblem

from frontier import aws
from frontier.config.outputs import Ec2Outputs
from frontier.config.schema import PoolSettings, Settings
from frontier.hosts.balancer import Balancer
from frontier.hosts.gateway_fronted import GatewayFronted
from frontier.hosts.inventory import HostSpec, InventoryError, static_hosts
from frontier.hosts.session import HostSession
from frontier.release.history import (
    DEFAULT_LOCK_TTL_S,
    HistoryStore,
    LockInfo,
    get_if_present,
    iso,
    now,
    operator,
)
from frontier.release.release import Release
from frontier.render.boot import replica_nodes
from frontier.rollout.aws_target import AwsTarget
from frontier.rollout.canary import CanaryVerification, canary_verification
from frontier.rollout.rolling import Event, Reporter, RolloutResult
from frontier.rollout.strategy import roll_hosts
from frontier.targets.ec2 import gateway as gateway_rolls
from frontier.targets.ec2 import rules
from frontier.targets.ec2.access import InstanceConnectKey, host_connection
from frontier.targets.ec2.balancer import AlbBalancer, weighted_balancer
from frontier.targets.ec2.discovery import HOST_PYTHON, discover
from frontier.targets.ec2.group import AsgFleet
from frontier.targets.ec2.pair_roll import PairRoll
from frontier.targets.ec2.replicas import claimed_slots, in_replica_order

# A surge host boots (drivers, image, weights) before its readiness timeout starts to count.
LAUNCH_ALLOWANCE_S = 900


@dataclass(frozen=True)
class RolloutEnd:
    """How a rollout of ``release`` ended, with what the steps after it need: the stack's history
    (its lock, its last good release), the result they add to, where they report, and how long
    they wait for a host the group still launches."""

    store: HistoryStore
    release: Release
    result: RolloutResult
    reporter: Reporter | None
    launch_timeout_s: float


class Ec2Backend(AwsTarget):
    kind = "ec2"
    creates_buckets = False

    def __init__(self, settings: Settings, pool: PoolSettings | None) -> None:
        super().__init__(settings, pool)
        self._key: InstanceConnectKey | None = None

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        """The hosts of ``group``; by default the pool's, a disaggregated pool's both halves in the
        order they roll (prefill, then decode)."""
        halves = self.pool.disaggregation
        if group is None and halves is not None:
            return [host for half in (halves.prefill, halves.decode) for host in self.hosts(half.group.name)]
        group_name = group or self.pool.group.name
        if self.settings.inventory.source == "static":
            return static_hosts(self.settings, group_name, python=HOST_PYTHON, resolve_root=str)
        found = discover(
            self.settings, self.aws_client("ec2"), group_name, root=HOST_ROOT, python=HOST_PYTHON
        )
        if self.replica_nodes(group_name) == 1:
            return found
        # A replica's nodes side by side, so each rollout wave holds whole replicas (replicas.py).
        outputs = self.outputs()
        slots = claimed_slots(
            self.aws_client("s3"), outputs.history_bucket, outputs.history_prefix, group_name
        )
        return in_replica_order(found, slots)

    def replica_nodes(self, group: str | None = None) -> int:
        """Nodes one replica of ``group`` (the serving group by default) spans."""
        name = group or self.pool.group.name
        return replica_nodes(self.settings, next(g for g in self.settings.node_groups if g.name == name))

    def in_place_reason(self, group: str | None = None) -> str:
        """Why a rollout of ``group`` (the serving group by default) may not launch new hosts first;
        "" where it may. Not where a replica spans several nodes: hosts launched mid-rollout would
        claim slots in replicas the rollout is taking apart; those groups roll in place, a wave of
        whole replicas at a time."""
        nodes = self.replica_nodes(group)
        if nodes == 1:
            return ""
        return f"a replica spans {nodes} nodes (runtime.nodes_per_replica): whole replicas roll in place"

    def outputs(self) -> Ec2Outputs[str]:
        """What ``pulumi up`` of the stack exported, as saved for ``fab``."""
        return aws.stack_outputs(self.settings, Ec2Outputs[str])

    def balancer(self) -> Balancer:
        """The ALB's target group, where the ALB fronts the runtimes. Behind a gateway the ALB fronts
        the gateway hosts alone: a runtime is drained by its own drain, read through its agent, and
        never put in the target group (:mod:`frontier.hosts.gateway_fronted`)."""
        gateway = self.settings.gateway
        if gateway is not None:
            return GatewayFronted(
                self.session,
                runtime_drain_s=self.pool.runtime.drain_timeout_s,
                probe_round_s=gateway.probe.interval_s + gateway.probe.timeout_s,
            )
        outputs = self.outputs()
        if self.settings.rollout.traffic_steps:
            return weighted_balancer(self.aws_client("elbv2"), outputs)
        return AlbBalancer(self.aws_client("elbv2"), outputs.target_group_arn)

    def fleet(self, group: str | None = None) -> AsgFleet | None:
        """The node group's auto scaling group; None for a static inventory (a fixed fleet)."""
        if self.settings.inventory.source == "static":
            return None
        return AsgFleet(
            self.settings,
            self.aws_client("autoscaling"),
            self.aws_client("ec2"),
            group or self.pool.group.name,
        )

    def rollout_size(self) -> int:
        return len(self.hosts())  # both halves of a disaggregated pool

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        """Surge where the group can grow, else one batch at a time; the group held while it runs.

        Hosts the group launches meanwhile (scale-out, a replaced host) boot the release being
        rolled: the pointer written first names it to their bootstrap. A failed rollout withdraws
        the pointer; a final pass then brings every host that joined during the rollout to the
        release the stack ends on. The first release to succeed turns on the group's replacement
        of unhealthy hosts, off until there was anything to serve (infra/nodes.py).

        Both the withdrawal and the final pass act for the deploy lock's holder: the lock held as
        the rollout starts (``deploy`` takes it first) is remembered, and a rollout that no longer
        holds it when it ends leaves the pointer, the hosts and the group to whoever does
        (:meth:`conclude`).

        A disaggregated pool rolls its prefill group, then its decode group, under one pointer
        (:mod:`frontier.targets.ec2.pair_roll`); each group's joined hosts then have their final pass.
        """
        store = self.history_store()
        held = store.read_lock()
        halves = self.pool.disaggregation
        if halves is not None:
            return self._roll_pair(
                store, held, release, kind, reporter, halves.prefill.group.name, halves.decode.group.name
            )
        fleet = self.fleet()
        hosts = self.hosts()
        launch_timeout_s = self.settings.rollout.readiness_timeout_s + LAUNCH_ALLOWANCE_S
        verification = self.canary_check(store, kind)
        name_the_release_being_rolled(store, release, kind, held)
        try:
            result = self.roll_group(
                fleet.group if fleet is not None else None,
                fleet,
                hosts,
                store,
                release,
                kind,
                reporter,
                launch_timeout_s,
                verification,
            )
        except BaseException:
            # A rollout that broke off (an AWS error, Ctrl-C) proved nothing: later hosts boot the
            # last good release (should this fail too, the pointer still expires with the lock).
            with contextlib.suppress(Exception):
                withdraw_the_release_being_rolled(store, held)
            raise
        self.conclude(fleet, store, hosts, release, result, reporter, launch_timeout_s, held=held)
        return result

    def _roll_pair(
        self,
        store: HistoryStore,
        held: LockInfo | None,
        release: Release,
        kind: str,
        reporter: Reporter | None,
        prefill: str,
        decode: str,
    ) -> RolloutResult:
        """:meth:`roll` of a disaggregated pool: its prefill group, then its decode group
        (:class:`PairRoll`), under one pointer; then each group's hosts that joined meanwhile."""
        launch_timeout_s = self.settings.rollout.readiness_timeout_s + LAUNCH_ALLOWANCE_S
        verification = self.canary_check(store, kind)
        pair = PairRoll(
            self,
            store,
            launch_timeout_s,
            reporter,
            withdraw=lambda: withdraw_the_release_being_rolled(store, held),
        )
        name_the_release_being_rolled(store, release, kind, held)
        try:
            result = pair.run(release, kind, verification, prefill, decode)
        except BaseException:
            with contextlib.suppress(Exception):
                withdraw_the_release_being_rolled(store, held)
            raise
        end = RolloutEnd(store, release, result, reporter, launch_timeout_s)
        self._conclude(end, held, pair.rolled.values())
        return result

    def canary_check(self, store: HistoryStore, kind: str) -> CanaryVerification | None:
        """What a rollout's canaries are verified with. Read (and refused) before any host is
        touched; only a deploy proves itself on the canary."""
        verify = kind == "deploy" and self.settings.rollout.verify_canary
        return canary_verification(self.settings, self.pool, self.runtime_key(), store) if verify else None

    def roll_group(
        self,
        group: str | None,
        fleet: AsgFleet | None,
        hosts: list[HostSpec],
        store: HistoryStore,
        release: Release,
        kind: str,
        reporter: Reporter | None,
        launch_timeout_s: float,
        verification: CanaryVerification | None,
    ) -> RolloutResult:
        """Roll ``release`` over ``hosts``, the hosts of node group ``group`` (its auto scaling group
        ``fleet``): canary, gates and surge as every rollout of the stack takes them."""
        return roll_hosts(
            self.settings,
            self.pool,
            store,
            hosts,
            self.balancer(),
            self.connect,
            release,
            kind,
            reporter,
            group=fleet,
            surge=not self.in_place_reason(group),
            in_place_reason=self.in_place_reason(group),
            launch_timeout_s=launch_timeout_s,
            verification=verification,
        )

    def conclude(
        self,
        fleet: AsgFleet | None,
        store: HistoryStore,
        rolled: list[HostSpec],
        release: Release,
        result: RolloutResult,
        reporter: Reporter | None,
        launch_timeout_s: float,
        *,
        held: LockInfo | None = None,
    ) -> None:
        """After rolling ``release`` over ``rolled``: what hosts that boot later serve, the hosts that
        joined meanwhile, and (once a release succeeded) the group's replacement of unhealthy hosts.

        ``held`` is the deploy lock as the rollout started under it. If the stack's lock is no
        longer that taking (another deploy took it over, ``fab unlock`` removed it, or its lease
        lapsed), the new holder owns the pointer and every host from here: nothing is withdrawn,
        no host is touched, and the result says why (a rollout that succeeded fails, so no record
        makes this release the stack's current one behind the new holder's back). Without
        ``held`` (a roll outside any lock) nothing is checked.
        """
        self._conclude(
            RolloutEnd(store, release, result, reporter, launch_timeout_s), held, [(fleet, rolled)]
        )

    def _conclude(
        self, end: RolloutEnd, held: LockInfo | None, groups: Iterable[tuple[AsgFleet | None, list[HostSpec]]]
    ) -> None:
        """:meth:`conclude` over each group the rollout rolled (none for a fixed fleet), with the
        hosts it had as the rollout started."""
        if not self.still_holds(end.store, held, end.result, end.reporter):
            return
        if end.result.outcome != "succeeded":
            withdraw_the_release_being_rolled(end.store, held)
        for fleet, rolled in groups:
            if fleet is not None:
                self.catch_up(fleet, rolled, end)

    def still_holds(
        self, store: HistoryStore, held: LockInfo | None, result: RolloutResult, reporter: Reporter | None
    ) -> bool:
        """Whether the rollout that ran under ``held`` still holds the stack's deploy lock; where
        not, ``result`` fails saying why (see :meth:`conclude`)."""
        lost = lock_lost(store, held) if held is not None else None
        if lost is None:
            return True
        (reporter or (lambda event: None))(Event("-", "conclude", "fail", lost))
        if result.outcome == "succeeded":
            result.outcome = "failed"
        result.reason = "; ".join(part for part in (result.reason, lost) if part)
        return False

    def catch_up(self, fleet: AsgFleet, rolled: list[HostSpec], end: RolloutEnd) -> None:
        """The hosts of ``fleet`` that joined while the rollout ran brought to the release the stack
        ends on; once a release succeeded, the group's replacement of unhealthy hosts on."""
        self._final_pass(fleet, rolled, end)
        if end.result.outcome == "succeeded" and not fleet.replaces_unhealthy():
            fleet.replace_unhealthy()

    def _final_pass(self, fleet: AsgFleet, rolled: list[HostSpec], end: RolloutEnd) -> None:
        """Roll the release the stack ends on over the hosts that joined while the rollout ran."""
        result, report = end.result, end.reporter or (lambda event: None)
        still_launching = fleet.settle(end.launch_timeout_s)
        if still_launching:
            report(Event("-", "final pass", "info", f"still launching: {', '.join(sorted(still_launching))}"))
        try:
            found = self.hosts(fleet.group)
        except InventoryError:  # every host gone (scaled to zero): nobody joined
            found = []
        joined = joined_hosts(rolled, result, found, fleet.in_service())
        if not joined:
            return
        if result.outcome == "succeeded":
            wanted: Release | None = end.release
        else:
            good = end.store.last_good()
            wanted = end.store.get_release(good["release"]) if good else None
        names = ", ".join(h.name for h in joined)
        if wanted is None:
            report(
                Event(
                    "-", "final pass", "info", f"joined during the rollout, no good release to give: {names}"
                )
            )
            return
        report(
            Event(
                "-", "final pass", "start", f"{wanted.id} onto hosts that joined during the rollout: {names}"
            )
        )
        caught_up = roll_hosts(
            self.settings,
            self.pool,
            end.store,
            joined,
            self.balancer(),
            self.connect,
            wanted,
            result.kind,
            end.reporter,
            group=fleet,
        )
        result.hosts += caught_up.hosts
        if caught_up.outcome != "succeeded":
            result.reason = "; ".join(
                part for part in (result.reason, f"final pass over {names}: {caught_up.reason}") if part
            )

    def roll_gateway(
        self, report: Callable[[gateway_rolls.RefreshProgress], None], *, timeout_s: float
    ) -> gateway_rolls.RefreshProgress:
        """Replace every gateway host, keeping the desired count healthy (an instance refresh of its
        group, :mod:`frontier.targets.ec2.gateway`), and wait until it succeeded."""
        autoscaling = self.aws_client("autoscaling")
        group = gateway_rolls.gateway_group_name(autoscaling, self.settings.stack, self.settings.region)
        refresh_id = gateway_rolls.start_gateway_refresh(autoscaling, group)
        return gateway_rolls.wait_for_refresh(
            autoscaling, group, refresh_id, timeout_s=timeout_s, poll_s=gateway_rolls.POLL_S, report=report
        )

    def connect(self, host: HostSpec) -> Any:
        """SSH to ``host`` by the stack's path (its outputs' ``host_access``), admitted by this run's key."""
        if self._key is None:
            self._key = InstanceConnectKey(self.settings, self.aws_client)
        host_access = self.outputs().host_access if host.instance_id else ""
        return host_connection(self.settings, host, host_access, self._key)

    def session(self, host: HostSpec) -> HostSession:
        return HostSession(self.settings, self.pool, host, self.connect(host))

    def stack_problems(self) -> Iterator[FieldProblem]:
        return rules.stack_problems(self.settings)

    def rendered_files(self, digest: str) -> dict[str, str]:
        """Nothing beyond every stack's files: the ALB and its target group are Pulumi's."""
        return {}


def deploying_pointer_key(store: HistoryStore) -> str:
    return store.prefix + DEPLOYING_POINTER


def name_the_release_being_rolled(
    store: HistoryStore, release: Release, kind: str, held: LockInfo | None = None
) -> None:
    """Tell hosts that boot from now on to serve ``release`` (frontier_hostside/bootstrap.py reads
    it), for as long as the deploy lock lasts: a ``fab`` that dies mid-rollout leaves a pointer
    that expires with its lock, and hosts fall back to the last good release. The pointer names
    the lock's taking (its token), so only that taking withdraws it."""
    lock = held or store.read_lock()
    expires = lock.expires if lock else iso(now() + dt.timedelta(seconds=DEFAULT_LOCK_TTL_S))
    pointer = {
        "release": release.id,
        "kind": kind,
        "since": iso(now()),
        "expires": expires,
        "by": operator(),
        "lock": lock.token if lock else "",
    }
    store.s3.put_object(
        Bucket=store.bucket,
        Key=deploying_pointer_key(store),
        Body=(json.dumps(pointer, indent=2, sort_keys=True) + "\n").encode(),
    )


def withdraw_the_release_being_rolled(store: HistoryStore, held: LockInfo | None = None) -> None:
    """Hosts that boot from now on serve the last good release again (the history's records).

    With ``held``, only a pointer written under that lock's taking goes, and only that very object
    (If-Match on its ETag): a pointer another deploy wrote since is its own."""
    key = deploying_pointer_key(store)
    if held is None:
        store.s3.delete_object(Bucket=store.bucket, Key=key)
        return
    # Listed first: the deploy role's GET of a missing key is refused (403) on AWS, not answered 404.
    found = get_if_present(store.s3, store.bucket, key)
    if found is None:
        return
    if json.loads(found["Body"].read()).get("lock") != held.token:
        return
    try:
        store.s3.delete_object(Bucket=store.bucket, Key=key, IfMatch=found["ETag"])
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("PreconditionFailed", "412", "NoSuchKey", "404"):
            raise


def lock_lost(store: HistoryStore, held: LockInfo) -> str | None:
    """Why the stack's deploy lock is no longer the taking ``held`` (None while it is).

    Read from the lock itself rather than from the lease's renewer, which learns of a takeover only
    at its next renewal: a takeover is a new taking (a new token), a removal leaves no lock, and a
    lease past its end may be taken at any moment."""
    current = store.read_lock()
    if current is None:
        return (
            f"the deploy lock of stack {store.stack!r} was removed while {held.purpose} ran: "
            "the pointer and the hosts that joined are left to the next deploy"
        )
    if current.token != held.token:
        return (
            f"the deploy lock of stack {store.stack!r} was taken over while {held.purpose} ran "
            f"(now held by {current.describe()}): the pointer and the hosts are its holder's, "
            "no final pass"
        )
    if current.lapsed():
        return (
            f"the deploy lock of stack {store.stack!r} lapsed at {current.lapses} while {held.purpose} "
            "ran: another deploy may take it at any moment, so no final pass"
        )
    return None


def joined_hosts(
    rolled: list[HostSpec], result: RolloutResult, now_found: list[HostSpec], in_service: set[str]
) -> list[HostSpec]:
    """In-service hosts the rollout neither started with nor launched itself (surge hosts)."""
    seen = {h.name for h in rolled} | {h.name for h in result.hosts}
    return [h for h in now_found if h.name not in seen and h.instance_id in in_service]
