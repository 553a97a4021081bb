"""``python -m frontier_runtime serve --config runtime.yaml [--host H] [--port P] [--model-dir DIR]``,
``python -m frontier_runtime node --config runtime.yaml [--leader ADDR] [--node-rank K] [--model-dir DIR]``
(a node other than the leader of a replica over several nodes: see ``engine.nodes``) and
``python -m frontier_runtime probe [--ready]`` (the container's health check) and
``python -m frontier_runtime prefetch --config runtime.yaml`` (the host cache warmed with what a
start of that config reads, nothing loaded: what a replacement host runs before it joins).

The working directory is the host's install root: relative paths in the config (weights cache,
a local model directory) resolve against it. ``--host``/``--port`` override the config so one
rendered runtime.yaml can serve several host slots on one machine. ``--kv-role``/``--kv-host``
override ``kv_transfer.role``/``host`` so the two halves of a disaggregated pool run one release's
config: a Kubernetes pod takes its role from its Deployment and its address from the downward API
(a pod's name, which the prefill would otherwise answer as ``remote_host``, resolves nowhere).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from frontier_hostside import names

# kv_transfer.role's values a command line may set: a colocated replica needs no flag.
KV_ROLES = ("prefill", "decode")

if TYPE_CHECKING:
    from frontier_runtime.config import RuntimeConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frontier_runtime", description="Frontier's inference runtime.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("--config", required=True, type=Path, help="the rendered runtime.yaml")
    serve.add_argument("--host", help="listen address (default: server.host from the config)")
    serve.add_argument("--port", type=_port, help="listen port, 0 for any free one (default: server.port)")
    serve.add_argument(
        "--model-dir", type=Path, help="serve this local model directory instead of model.source"
    )
    serve.add_argument(
        "--kv-role", choices=KV_ROLES, help="this replica's kv_transfer.role (default: the config's)"
    )
    serve.add_argument(
        "--kv-host",
        help="the address a prefill's transfer listener binds and answers as remote_host "
        "(default: kv_transfer.host from the config)",
    )
    node = commands.add_parser(
        "node", help="run this node's ranks of a replica whose leader (node 0) runs serve elsewhere"
    )
    node.add_argument("--config", required=True, type=Path, help="the rendered runtime.yaml (the leader's)")
    node.add_argument("--leader", help=f"the leader's address (default: ${names.LEADER_ADDRESS_ENV})")
    node.add_argument(
        "--node-rank", type=int, help=f"this node's index, 1.. (default: ${names.NODE_RANK_ENV})"
    )
    node.add_argument("--model-dir", type=Path, help="this local model directory instead of model.source")
    prefetch = commands.add_parser(
        "prefetch",
        help="fetch and verify into the host cache what a start of this config reads, then exit "
        "(one JSON line on stdout)",
    )
    prefetch.add_argument("--config", required=True, type=Path, help="the rendered runtime.yaml")
    probe = commands.add_parser(
        "probe", help="exit 0 when the running server is live (the container's health check)"
    )
    probe.add_argument("--ready", action="store_true", help="check readiness instead of liveness")
    return parser


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer within 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be within 0..65535, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "probe":
        from frontier_runtime.server.probe import run_probe

        healthy, why = run_probe(ready=args.ready)
        print(why, file=sys.stdout if healthy else sys.stderr)
        return 0 if healthy else 1
    from frontier_runtime.config import ConfigError, load_config
    from frontier_runtime.server.logs import configure_logging

    try:
        config = load_config(args.config)
        if args.command == "serve" and (args.kv_role or args.kv_host):
            config = _with_kv_transfer(config, args.kv_role, args.kv_host)
    except (ConfigError, OSError) as exc:
        print(f"frontier_runtime: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.json_logs)
    if args.command == "prefetch":
        return _prefetch(config)
    if args.model_dir is not None and not args.model_dir.is_dir():
        print(f"frontier_runtime: --model-dir {args.model_dir} is not a directory", file=sys.stderr)
        return 2
    if args.command == names.NODE_COMMAND:
        return _node(config, args)
    from frontier_runtime.server.serve import serve

    return serve(config, host=args.host, port=args.port, model_dir=args.model_dir)


def _with_kv_transfer(config: RuntimeConfig, role: str | None, host: str | None) -> RuntimeConfig:
    """``config`` with the command line's KV transfer role and address, validated as the file is
    (a decode without prefix caching, or a role on a replica of several ranks, is refused)."""
    from frontier_settings import ConfigError, problems_of
    from pydantic import ValidationError

    from frontier_runtime.config import RuntimeConfig

    data = config.model_dump(mode="json")
    data["kv_transfer"].update({k: v for k, v in (("role", role), ("host", host)) if v is not None})
    try:
        return RuntimeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"--kv-role/--kv-host: {p}" for p in problems_of(exc))) from None


def _prefetch(config: RuntimeConfig) -> int:
    """The host cache warmed for a start of ``config`` (``server.warm_start.prefetch``)."""
    import json

    from frontier_runtime.server.warm_start import prefetch
    from frontier_runtime.storage.weights import WeightsError

    try:
        answer = {"ok": True, **prefetch(config)}
    except (WeightsError, OSError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 2
    print(json.dumps(answer, sort_keys=True))
    return 0


def _node(config: RuntimeConfig, args: argparse.Namespace) -> int:
    """Fetch the weights as serve does, then run this node's ranks until the replica breaks."""
    from frontier_runtime.engine.config import EngineConfig
    from frontier_runtime.engine.nodes import NodeRole, ReplicaError
    from frontier_runtime.engine.tp_worker import run_node
    from frontier_runtime.server.serve import resolve_model_dir

    env = dict(os.environ)
    if args.leader is not None:
        env[names.LEADER_ADDRESS_ENV] = args.leader
    if args.node_rank is not None:
        env[names.NODE_RANK_ENV] = str(args.node_rank)
    try:
        if config.nodes_per_replica == 1:
            raise ReplicaError("runtime.nodes_per_replica is 1: this replica has no other node to run")
        role = NodeRole.from_env(config.nodes_per_replica, env)
        engine_config = EngineConfig.from_runtime(config, resolve_model_dir(config, args.model_dir))
        return run_node(engine_config, role)
    except (ReplicaError, ValueError, OSError) as exc:
        print(f"frontier_runtime node: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
