"""Roll a release over a disaggregated pool's two node groups: prefill first, then decode.

Each half is an auto scaling group of its own, and each goes through the whole host rollout every
EC2 group takes (its canary, its gates, surge where its ``max_size`` leaves room), with the
release's one ``runtime.yaml``; a host takes its role from its group's ``node.env``. Why this
order (the Kubernetes pair rollout, :mod:`frontier.targets.kubernetes.pair_rollout`, takes the same):

- **The decode is the pair's client.** It connects to a prefill's listener and pulls; a prefill
  only answers. A new release is first a new listener for old decodes, as a server goes before
  its clients, and only then a new puller.
- **The decode's canary is gated on the pair the release will run.** Rolled second, its canary
  pulls from prefill hosts already on the release, so its gate measures new prefill with new
  decode, end to end, before any other decode host changes. With ``rollout.verify_canary`` each
  of its cases goes through a prefill host on the release first, as the gateway sends a request
  (:mod:`frontier.targets.ec2.pair_verify`), and the greedy ones are held to the golden outputs the
  prefill's canary recorded from the old release (one recording a release), read back from the
  history.
- **A pair never stays mixed.** When the decode's rollout fails (its hosts are back on the release
  they ran), the prefill group is rolled back to the stack's last good release through the same
  gates, so the pool is never left on two releases; the history says why.

Hosts that boot meanwhile take the release the deploy pointer names, in either group; the caller
(:meth:`frontier.targets.ec2.backend.Ec2Backend.roll`) withdraws it on failure and brings the
hosts that joined each group to the release the pool ends on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from frontier.config.schema import PoolSettings, Settings
from frontier.hosts.inventory import HostSpec
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.rollout.canary import CanaryVerification, canary_verification
from frontier.rollout.rolling import Event, Reporter, RolloutResult
from frontier.targets.ec2.group import AsgFleet
from frontier.targets.ec2.pair_verify import through_prefill


class Groups(Protocol):
    """What the pair asks of the EC2 backend: each group's fleet and hosts, and one group's roll."""

    @property
    def settings(self) -> Settings: ...

    @property
    def pool(self) -> PoolSettings: ...

    def fleet(self, group: str | None = None) -> AsgFleet | None: ...

    def hosts(self, group: str | None = None) -> list[HostSpec]: ...

    def runtime_key(self) -> str | None: ...

    def connect(self, host: HostSpec) -> Any: ...

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
    ) -> RolloutResult: ...


@dataclass
class PairRoll:
    groups: Groups
    store: HistoryStore
    launch_timeout_s: float
    reporter: Reporter | None
    #: Hosts that boot from now on serve the last good release again (the deploy pointer withdrawn).
    withdraw: Callable[[], None]
    #: Each group, by name, with the hosts it had as the pair's rollout started (for the caller's
    #: final pass over the hosts that joined it meanwhile).
    rolled: dict[str, tuple[AsgFleet | None, list[HostSpec]]] = field(default_factory=dict)

    def report(self, event: Event) -> None:
        if self.reporter is not None:
            self.reporter(event)

    def _roll(
        self,
        group: str,
        release: Release,
        kind: str,
        verification: CanaryVerification | None,
        *,
        again: bool = False,
    ) -> RolloutResult:
        fleet, hosts = self.rolled[group]
        if again:  # its hosts now: it may have scaled, or a surge replaced them, since the start
            hosts = self.groups.hosts(group)
        self.report(Event("-", group, "info", f"rolling {release.id} over node group {group!r}"))
        return self.groups.roll_group(
            group, fleet, hosts, self.store, release, kind, self.reporter, self.launch_timeout_s, verification
        )

    def run(
        self,
        release: Release,
        kind: str,
        verification: CanaryVerification | None,
        prefill: str,
        decode: str,
    ) -> RolloutResult:
        # Read before anything changes: the release the pair runs now, for the way back, and both
        # groups (a pool whose decode group cannot be found rolls neither half).
        before = self.store.last_good()
        for group in (prefill, decode):
            self.rolled[group] = (self.groups.fleet(group), self.groups.hosts(group))
        first = self._roll(prefill, release, kind, verification)
        first.strategy = f"prefill {prefill}: {first.strategy}"
        if first.outcome != "succeeded":
            first.reason = f"prefill group {prefill!r}: {first.reason}; the decode group was not touched"
            return first  # the prefill hosts are back where they were, and no decode host changed
        try:
            with self._through_prefill(verification, prefill, release) as paired:
                second = self._roll(decode, release, kind, paired, again=True)
        except Exception as exc:  # noqa: BLE001 - the prefill must not stay on the release alone
            # An error around the decode's host rollout (reaching the prefill host, holding the
            # group, an AWS call between surge waves): that rollout restores every host it switched,
            # and a surge host it left on the release is one the caller's final pass brings back.
            second = RolloutResult(kind, release.id, outcome="failed", reason=f"{type(exc).__name__}: {exc}")
        result = RolloutResult(
            kind=kind,
            release=release.id,
            outcome=second.outcome,
            reason=second.reason and f"decode group {decode!r}: {second.reason}",
            hosts=[*first.hosts, *second.hosts],
            duration_s=round(first.duration_s + second.duration_s, 3),
            strategy=f"{first.strategy}; decode {decode}: {second.strategy}",
        )
        if second.outcome == "succeeded":
            return result
        self._put_prefill_back(result, release, kind, before, prefill)
        return result

    @contextlib.contextmanager
    def _through_prefill(
        self, verification: CanaryVerification | None, prefill: str, release: Release
    ) -> Iterator[CanaryVerification | None]:
        """The decode's canary verification: its cases through a prefill host, now on ``release``,
        held to the golden outputs the prefill's canary recorded from the old release (read back
        from the history); the prefill host's connection closed after the decode's roll."""
        if verification is None:
            yield None
            return
        held = canary_verification(self.groups.settings, self.groups.pool, self.groups.runtime_key(), self.store)
        assert held is not None  # verification is on: the stack's rollout.verify_canary
        through = self.groups.hosts(prefill)[0]
        conn = self.groups.connect(through)
        self.report(
            Event(
                through.name,
                "verify",
                "info",
                f"the decode's canary answers through this prefill host ({release.id})",
            )
        )
        try:
            yield through_prefill(held, conn, through.address)
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _put_prefill_back(
        self, result: RolloutResult, release: Release, kind: str, before: dict[str, Any] | None, prefill: str
    ) -> None:
        """The decode is back on the release it ran: the prefill group goes back to it too."""
        if before is None:
            result.outcome = "failed"
            result.reason += (
                f"; the prefill group {prefill!r} keeps {release.id}: the stack has no earlier good "
                "release to put it back to"
            )
            return
        back = self.store.get_release(before["release"])
        # Hosts that boot while the prefill goes back take the release it goes back to.
        self.withdraw()
        self.report(
            Event("-", "restore", "info", f"the decode failed: prefill group {prefill!r} back to {back.id}")
        )
        undo = self._roll(prefill, back, kind, None, again=True)
        for host in undo.hosts:
            if host.outcome == "updated":
                host.outcome = "restored"  # back on the release it ran before this rollout
        result.hosts += undo.hosts
        result.duration_s = round(result.duration_s + undo.duration_s, 3)
        if undo.outcome == "succeeded":
            result.reason += f"; the prefill group {prefill!r} was put back to {back.id}"
            return
        result.outcome = "failed"
        result.reason += f"; putting the prefill group {prefill!r} back to {back.id} failed: {undo.reason}"
