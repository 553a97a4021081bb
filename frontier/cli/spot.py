"""``spot.notice``: raise a spot interruption notice or a rebalance recommendation on a local host slot."""

from __future__ import annotations

from invoke import Collection, task
from rich.console import Console

from frontier.cli.common import reports_errors, settings_for
from frontier.errors import FrontierError
from frontier.targets.local import cluster as local
from frontier.targets.local import notices
from frontier.targets.local.iam import pool_of_host
from frontier.targets.local.imds import SPOT_NOTICE_S

STACK_HELP = "stack name (default $FRONTIER_STACK, else local)"


@task(
    name="notice",
    help={
        "stack": STACK_HELP,
        "host": "the host slot that gets the notice (inventory.hosts[].name)",
        "rebalance": "a rebalance recommendation instead of a spot interruption notice",
        "action": "the spot notice's instance-action: terminate, stop or hibernate (default terminate)",
        "in_s": f"seconds from now to the instance's end, 0-3600 (default {SPOT_NOTICE_S:g}, as EC2)",
        "no_wait": "return once the notice is posted, without waiting for the slot to act on it",
    },
)
@reports_errors
def notice(c, host, stack=None, rebalance=False, action="terminate", in_s=None, no_wait=False):
    """Post a notice to a local slot's IMDS stand-in; its agent drains the slot as on a spot instance."""
    settings = settings_for(stack)
    try:
        seconds = SPOT_NOTICE_S if in_s is None else float(in_s)
    except ValueError:
        raise FrontierError(f"--in-s {in_s!r}: give a number of seconds between 0 and 3600") from None
    kind = "rebalance" if rebalance else "spot"
    posted = notices.post(settings, host, kind, action, seconds)
    console = Console()
    console.print(f"{posted.host}: {kind} notice posted to {posted.imds}: {posted.notice}")
    if no_wait:
        return
    # A poll, the gateway's answer, then the runtime's drain (a spot notice stops it).
    timeout = 3 * local.IMDS_POLL_S + max(p.runtime.drain_timeout_s for p in settings.pools) + 15
    entry = notices.wait_handled(settings, posted, timeout)
    if entry is None:
        raise FrontierError(
            f"{posted.host}: its interruption watcher did not act on the notice within {timeout:g} s "
            f"(see {local.host_root(notices.slot(settings, posted.host)) / 'logs' / 'interruptions.log'})"
        )
    if not entry.get("out_of_service"):
        console.print(f"{posted.host}: recorded; it keeps serving (the group replaces it before it goes)")
        # EC2's group answers the recommendation itself; here the local group does, with a warm spare
        # of the pool the host at risk serves.
        at_risk = pool_of_host(settings, notices.slot(settings, posted.host))
        warmed = notices.warm_replacement(settings, at_risk, console.print)
        if warmed is None:
            console.print("no spare slot to warm: the group launches its replacement cold")
        else:
            what = "prepared weights" if warmed.prepared else "weights"
            console.print(
                f"{warmed.host.name}: warmed for {warmed.release} in {warmed.seconds:.1f} s "
                f"({warmed.bytes_fetched} bytes of {what} fetched); its launch fetches no weights"
            )
        return
    told = ", ".join(
        f"{g.get('gateway')} moved {g.get('moved', 0)} stream(s)" if g.get("status") == 200 else f"{g.get('gateway')}: {g.get('error')}"
        for g in entry.get("gateways", ())
    )  # fmt: skip
    console.print(
        f"{posted.host}: out of service {entry.get('drained_after_s')} s after its agent saw the notice "
        f"(runtime {entry.get('stop', {}).get('outcome', '?')})" + (f"; gateway: {told}" if told else "")
    )


def register(namespace: Collection) -> None:
    namespace.add_collection(Collection("spot", notice))
