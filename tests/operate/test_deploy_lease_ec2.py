"""An EC2 deploy that lost its lock leaves the stack to the deploy that holds it, against moto.

The deploy lock is a lease (tests/operate/test_deploy_lease.py). On EC2 a deploy does two things
after its last host step: a failed one withdraws the pointer that tells booting hosts which release
to serve, and a final pass rolls the release the stack ends on over hosts that joined meanwhile.
Both belong to whoever holds the lock by then. Here another deploy takes the lock while ours runs
(``break_lock`` + ``acquire``, as a takeover of a lapsed lock does) and writes its own pointer, the
group scales out by one host, and ours concludes: it must leave the pointer and the new host alone.
moto's group and instances stand in for EC2; no host answers SSH (see test_fleet_during_deploys.py).
"""

from __future__ import annotations

import json

from frontier_hostside.names import DEPLOYING_POINTER
from test_fleet_during_deploys import deployed, release  # noqa: F401 - fixture
from test_fleet_ec2 import fleet, prod  # noqa: F401 - prod is a fixture

from frontier.release.history import HistoryStore
from frontier.rollout.rolling import Event, HostResult, RolloutResult
from frontier.targets.ec2.backend import (
    lock_lost,
    name_the_release_being_rolled,
    withdraw_the_release_being_rolled,
)


def pointer(store: HistoryStore) -> dict | None:
    listed = store.s3.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + DEPLOYING_POINTER)
    if not listed.get("KeyCount"):
        return None
    return json.loads(
        store.s3.get_object(Bucket=store.bucket, Key=store.prefix + DEPLOYING_POINTER)["Body"].read()
    )


def test_a_failed_deploy_whose_lock_was_taken_over_leaves_the_new_holders_pointer_and_hosts_alone(deployed):  # noqa: F811
    backend, store, _ = deployed
    ours, theirs = release("ours"), release("theirs")
    store.put_release(ours)
    store.put_release(theirs)
    f = fleet(backend.settings)
    hosts = backend.hosts()
    held = store.acquire(f"deploy {ours.id}", ttl_s=3600)
    name_the_release_being_rolled(store, ours, "deploy", held)
    # Meanwhile: bob takes the lock, names his release to booting hosts, and the group scales out.
    store.break_lock()
    bobs = store.acquire(f"deploy {theirs.id}", ttl_s=3600, holder="bob@ci")
    name_the_release_being_rolled(store, theirs, "deploy", bobs)
    f.scale(f.size().desired + 1)
    events: list[Event] = []
    result = RolloutResult("deploy", ours.id, outcome="failed", reason="host-2: switch failed")
    result.hosts = [HostResult(h.name, to_release=ours.id) for h in hosts]

    backend.conclude(f, store, hosts, ours, result, events.append, launch_timeout_s=1, held=held)

    named = pointer(store) or {}
    assert (named.get("release"), named.get("lock")) == (theirs.id, bobs.token)
    assert [h.name for h in result.hosts] == [h.name for h in hosts]  # no final pass
    [stopped] = events
    assert (stopped.phase, stopped.status) == ("conclude", "fail")
    assert "taken over" in stopped.detail and "bob@ci" in stopped.detail
    assert result.reason.startswith("host-2: switch failed; the deploy lock of stack 'prod' was taken over")


def test_a_deploy_that_succeeded_after_losing_its_lock_fails_so_no_record_makes_it_current(deployed):  # noqa: F811
    backend, store, _ = deployed
    ours = release("ours")
    store.put_release(ours)
    f = fleet(backend.settings)
    hosts = backend.hosts()
    held = store.acquire(f"deploy {ours.id}", ttl_s=3600)
    name_the_release_being_rolled(store, ours, "deploy", held)
    store.break_lock()  # `fab unlock` while it ran
    f.scale(f.size().desired + 1)
    result = RolloutResult("deploy", ours.id, outcome="succeeded")
    result.hosts = [HostResult(h.name, to_release=ours.id) for h in hosts]

    backend.conclude(f, store, hosts, ours, result, None, launch_timeout_s=1, held=held)

    assert result.outcome == "failed" and "was removed while deploy" in result.reason
    assert [h.name for h in result.hosts] == [h.name for h in hosts]  # no final pass
    # The group's replacement of unhealthy hosts stays as the lock's next holder finds it.
    assert not f.replaces_unhealthy()


def test_a_failed_deploy_that_still_holds_its_lock_withdraws_its_pointer_and_revisits_joined_hosts(deployed):  # noqa: F811
    backend, store, good = deployed
    ours = release("ours")
    store.put_release(ours)
    f = fleet(backend.settings)
    hosts = backend.hosts()
    held = store.acquire(f"deploy {ours.id}", ttl_s=3600)
    name_the_release_being_rolled(store, ours, "deploy", held)
    f.scale(f.size().desired + 1)
    result = RolloutResult("deploy", ours.id, outcome="failed", reason="host-2: switch failed")
    result.hosts = [HostResult(h.name, to_release=ours.id) for h in hosts]

    backend.conclude(f, store, hosts, ours, result, None, launch_timeout_s=1, held=held)

    assert pointer(store) is None
    [late] = [h for h in result.hosts if h.name not in {r.name for r in hosts}]
    assert late.to_release == good.id  # the final pass ran, with the last good release
    assert lock_lost(store, held) is None


def test_a_pointer_another_taking_wrote_is_not_withdrawn(deployed):  # noqa: F811
    _, store, _ = deployed
    ours, theirs = release("ours"), release("theirs")
    held = store.acquire(f"deploy {ours.id}", ttl_s=3600)
    store.break_lock()
    bobs = store.acquire(f"deploy {theirs.id}", ttl_s=3600, holder="bob@ci")
    name_the_release_being_rolled(store, theirs, "deploy", bobs)
    withdraw_the_release_being_rolled(store, held)
    assert (pointer(store) or {}).get("release") == theirs.id
    withdraw_the_release_being_rolled(store, bobs)
    assert pointer(store) is None


def test_a_lock_whose_lease_lapsed_counts_as_lost_even_before_anyone_takes_it(deployed):  # noqa: F811
    _, store, _ = deployed
    short = HistoryStore(store.s3, store.bucket, store.stack, store.prefix, lease_s=0.0)
    held = short.acquire("deploy r-000000000001", ttl_s=3600)
    reason = lock_lost(short, held)
    assert reason is not None and "lapsed" in reason


def test_an_ec2_rollout_whose_lock_is_taken_over_midway_ends_without_touching_the_new_holders_share(deployed):  # noqa: F811
    backend, store, good = deployed
    ours, theirs = release("ours"), release("theirs")
    store.put_release(ours)
    store.put_release(theirs)
    taken: list[str] = []

    def bob_takes_over(event: Event) -> None:
        # At the rollout's first step: bob's deploy takes the lock, names its release, and the group
        # scales out by one host.
        if taken:
            return
        store.break_lock()
        bobs = store.acquire(f"deploy {theirs.id}", ttl_s=3600, holder="bob@ci")
        name_the_release_being_rolled(store, theirs, "deploy", bobs)
        f = fleet(backend.settings)
        f.scale(f.size().desired + 1)
        taken.append(bobs.token)

    with store.leased(f"deploy {ours.id}", ttl_s=3600):
        result = backend.roll(ours, "deploy", bob_takes_over)
    assert taken and result.outcome != "succeeded"
    assert "was taken over while deploy" in result.reason and "bob@ci" in result.reason
    named = pointer(store) or {}
    assert (named.get("release"), named.get("lock")) == (theirs.id, taken[0])
    # A final pass after a failed rollout rolls the last good release over hosts that joined: none ran.
    assert not [h.name for h in result.hosts if h.to_release == good.id]
