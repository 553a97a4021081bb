"""The host bootstrap: what a host does by itself, without ``fab`` (pull, not only push).

Run on the host by cloud-init (``boot``) and by a systemd service (``watch``), with the host's own
``python3``; like the host agent it imports the standard library only (and its names and modules
from ``frontier_hostside/``, which travels beside it), so the file that is tested here is byte for byte
what hosts run (Pulumi uploads it beside the agent, under the history prefix's ``host/``)::

    boot       read the release to serve from the history in S3: the one a deploy in progress
               names in ``releases/deploying.json`` (until it expires), else the stack's current
               good release (the newest deploy or rollback record that succeeded: what
               ``HistoryStore.last_good()`` returns); fetch it,
               verify it (each file against release.json, and the release id recomputed from the
               digest and the file hashes), stage and start it with the host agent, wait until it is
               ready, then complete the ASG launch lifecycle hook with CONTINUE, so the host joins the
               target group ready. Any failure: ABANDON, with the reason in the log and in a boot
               record under ``boots/`` of the history prefix.
    prefetch   what ``boot`` does up to the start, and the weights cache filled with what the
               release's start will read (the agent's ``prefetch``); nothing starts and no hook is
               completed. A replacement warmed this way, booted later, fetches no weights.
    abandon    ABANDON the launch hook with a reason (cloud-init's steps before ``boot`` use it).
    publish    scrape the runtime's /metrics once and put QueueDepth, RunningRequests, the
               end-to-end latency (values with counts from the histogram, so CloudWatch computes true
               percentiles) and RuntimeRestarts (restarts since the last publish) into CloudWatch.
    publish-gateway
               on a gateway host (``/etc/frontier/gateway.env``): scrape the gateway's admin
               /metrics once (over TLS with the host's own certificate as the only trusted one) and
               put each pool's HeldRequests under the pool's node group (what its from-zero alarm
               reads) and GatewayRequests and Gateway5xx (answered since the last publish) into
               CloudWatch. Run by a systemd timer (templates/gateway-cloud-init.yaml.j2).
    watch      every ``--interval`` seconds: publish, and look at the host's lifecycle state; on
               Terminating:Wait (scale-in, instance refresh) stop the runtime through the agent,
               which drains it, then complete the terminate hook, so no request is cut.
    replica-env
               on a group whose replica spans several nodes (``FRONTIER_NODES_PER_REPLICA``), run
               before each start of the runtime unit: claim or find this host's slot (replica,
               node) in S3 (frontier_hostside/rendezvous.py), write the node's rank, its leader's
               address and the replica's key to /run/frontier/replica.env (tmpfs, mode 0600), and
               on a worker point its leader proxy at the leader.

Each command is one function of :mod:`frontier_hostside.node_boot` (``publish-gateway``:
:mod:`frontier_hostside.gateway_boot`); AWS is reached through its CLI
(:mod:`frontier_hostside.aws_cli`). This file is only the command line.

Configuration: ``KEY=VALUE`` lines of ``/etc/frontier/node.env`` (``--env``), rendered by Frontier
from the stack (see ``templates/cloud-init.yaml.j2``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from frontier_hostside.aws_cli import Aws, BootError
from frontier_hostside.gateway_boot import GatewayNodeConfig, publish_gateway
from frontier_hostside.names import LEADER_ENV_FILE, REPLICA_ENV_FILE
from frontier_hostside.node_boot import NodeConfig, abandon, boot, prefetch, publish, replica_env, watch

DEFAULT_ENV = "/etc/frontier/node.env"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frontier-bootstrap", description=__doc__.split("\n")[0])
    parser.add_argument("--env", default=os.environ.get("FRONTIER_NODE_ENV", DEFAULT_ENV))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("boot")
    commands.add_parser("prefetch")
    commands.add_parser("publish")
    commands.add_parser("publish-gateway")
    abandon_parser = commands.add_parser("abandon")
    abandon_parser.add_argument("--reason", required=True)
    watch_parser = commands.add_parser("watch")
    watch_parser.add_argument("--interval", type=float, default=60.0)
    watch_parser.add_argument("--rounds", type=int, default=0)
    replica_parser = commands.add_parser("replica-env")
    replica_parser.add_argument("--out", default=REPLICA_ENV_FILE)
    replica_parser.add_argument("--leader-env", default=LEADER_ENV_FILE)
    replica_parser.add_argument("--restart-proxy", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish-gateway":
            gateway = GatewayNodeConfig.load(args.env)
            answer = publish_gateway(gateway, Aws(gateway.region))
            print(json.dumps(answer, sort_keys=True))
            return 0
        config = NodeConfig.load(args.env)
        aws = Aws(config.region, bucket=config.history_bucket)
        if args.command == "boot":
            answer = boot(config, aws)
        elif args.command == "prefetch":
            answer = prefetch(config, aws)
        elif args.command == "abandon":
            answer = abandon(config, aws, args.reason)
        elif args.command == "publish":
            answer = publish(config, aws)
        elif args.command == "replica-env":
            answer = replica_env(config, aws, Path(args.out), Path(args.leader_env), args.restart_proxy)
        else:
            answer = watch(config, aws, args.interval, args.rounds)
    except (BootError, OSError) as exc:
        answer = {"ok": False, "error": str(exc)}
    print(json.dumps(answer, sort_keys=True))
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
