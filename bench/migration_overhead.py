"""What migration costs a request that never moves: latency through a gateway with
``migration_limit: 3`` (token ids asked for and stripped from each chunk; a non-streamed request
sent up as a stream and assembled) against one with ``migration_limit: 0`` and against the runtime
directly, one tiny random checkpoint, the three paths taking turns request by request so they share
the machine's load.

    .venv/bin/python bench/migration_overhead.py [--requests 150]

Prints p50 per path and the added milliseconds over direct, for 1 and 64 completion tokens,
streamed and not, with the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import KEY, MODEL, free_port, gateway_command, process, runtime_command, wait_http  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=150, help="per path and case, 10..100000 (default 150)"
    )
    args = parser.parse_args()
    if not 10 <= args.requests <= 100_000:
        parser.error(f"--requests {args.requests} must be within 10..100000")
    from frontier_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_dir = make_tiny_checkpoint(work / "model", seed=1)
        port = free_port()
        runtime = f"http://127.0.0.1:{port}"
        log = work / "runtime.log"
        proc = stack.enter_context(process(runtime_command(model_dir, work, port), log))
        wait_http(runtime + "/health/ready", proc, log)
        urls = {"direct": runtime}
        for name, limit in (("off", 0), ("on", 3)):
            gport = free_port()
            command = gateway_command(runtime, work, name, gport)
            config = work / f"gateway-{name}.yaml"
            config.write_text(
                yaml.safe_dump({**yaml.safe_load(config.read_text()), "migration_limit": limit})
            )
            glog = work / f"gateway-{name}.log"
            gproc = stack.enter_context(process([*command, "--host", "127.0.0.1"], glog))
            wait_http(f"http://127.0.0.1:{gport}/health/ready", gproc, glog)
            urls[name] = f"http://127.0.0.1:{gport}"
        client = stack.enter_context(httpx.Client(timeout=60))
        headers = {"Authorization": f"Bearer {KEY}"}
        print(f"load average {os.getloadavg()[0]:.1f}")
        print("| case | direct p50 ms | migration off: added ms | migration on: added ms |")
        print("|---|---|---|---|")
        for stream in (False, True):
            for max_tokens in (1, 64):
                body = {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "temperature": 0}
                body["stream"] = stream
                times: dict[str, list[float]] = {name: [] for name in urls}
                for _ in range(args.requests):
                    for name, url in urls.items():
                        started = time.perf_counter()
                        answer = client.post(url + "/v1/completions", json=body, headers=headers)
                        if answer.status_code != 200:
                            raise SystemExit(f"{name}: HTTP {answer.status_code}: {answer.text[:300]}")
                        times[name].append(time.perf_counter() - started)
                p50 = {name: statistics.median(t) * 1000 for name, t in times.items()}
                print(
                    f"| {'streamed' if stream else 'plain'}, {max_tokens} tokens | {p50['direct']:.2f} | "
                    f"{p50['off'] - p50['direct']:+.2f} | {p50['on'] - p50['direct']:+.2f} |"
                )
        print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
