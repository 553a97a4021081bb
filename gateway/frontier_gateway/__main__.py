"""``python -m frontier_gateway serve --config gateway.yaml [--host H] [--port P] [--admin-port A]
[--tls-cert PEM --tls-key PEM]``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frontier_gateway", description="Frontier's gateway.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API in front of the model pools")
    serve.add_argument("--config", required=True, type=Path, help="the rendered gateway.yaml")
    serve.add_argument("--host", help="listen address (default: host from the config)")
    serve.add_argument(
        "--port", type=int, help="listen port, 0 for any free one (default: port from the config)"
    )
    serve.add_argument(
        "--admin-port",
        type=int,
        help="port of /metrics on admin_host, 0 for any free one (default: admin_port from the config)",
    )
    serve.add_argument("--tls-cert", help="PEM certificate: serve HTTPS (with --tls-key)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    args = parser.parse_args(argv)
    from frontier_gateway.config import ConfigError, load_config
    from frontier_gateway.tenants import TenantKeyError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"frontier_gateway: {exc}", file=sys.stderr)
        return 2
    from frontier_gateway.serve import serve as run

    try:
        return run(
            config,
            host=args.host,
            port=args.port,
            admin_port=args.admin_port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
    except (TenantKeyError, ValueError, OSError) as exc:  # keys, the two ports, a taken address
        print(f"frontier_gateway: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
