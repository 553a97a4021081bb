"""The synthetic probe: one fixed request through the stack's public endpoint, as a client sends it.

Every minute, on every target, the same code: on EC2 a Lambda function on an EventBridge schedule
(``infra/probe_handler.py``, made by ``infra/probe.py``), on Kubernetes a CronJob in the runtime's image
(``python -m frontier_hostside.probe``), on the local stack its alarm evaluator
(``frontier/targets/local/alarms.py``). The request is a one-token greedy completion of a fixed
prompt for each model; the probe succeeds when every model answers 200 with a choice within the
timeout. Each run publishes ``ProbeSuccess`` (1 or 0) and ``ProbeLatency`` (ms, the slowest model)
under the dimension ``Stack`` in the runtime's CloudWatch namespace (the EC2 and local alarms read
them); on Kubernetes the CronJob's exit status is its outcome (kube-state-metrics publishes its last
success, which the rule reads) and its one JSON line, latency included, is in the job's log.

Standard library only, like the rest of ``frontier_hostside``: :func:`publish` takes the boto3
client of its caller (the Lambda's handler, the local evaluator).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from frontier_hostside.names import CLOUDWATCH_NAMESPACE, PROBE_LATENCY_CW_METRIC, PROBE_SUCCESS_CW_METRIC

PROBE_PATH = "/v1/completions"
PROBE_PROMPT = "Frontier synthetic probe: reply with one token."
DEFAULT_TIMEOUT_S = 20.0
STACK_DIMENSION = "Stack"

# The Lambda's and the CronJob's settings, as environment variables.
ENDPOINT_ENV = "FRONTIER_PROBE_ENDPOINT"
MODELS_ENV = "FRONTIER_PROBE_MODELS"  # comma-separated
STACK_ENV = "FRONTIER_PROBE_STACK"
KEY_ENV = "FRONTIER_PROBE_KEY"  # the key itself (the local stack)
# Or the Secrets Manager secret holding it: one for every model, or one per model of MODELS_ENV in
# its order, comma-separated (EC2: each model's pool's own secret; Kubernetes: the CronJob's pool's).
KEY_SECRET_ENV = "FRONTIER_PROBE_KEY_SECRET"
TIMEOUT_ENV = "FRONTIER_PROBE_TIMEOUT_S"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    latency_ms: float
    # The first failure: the model, the HTTP status (0: none came back) and why.
    model: str = ""
    status: int = 0
    error: str = ""


def probe_body(model: str) -> bytes:
    return json.dumps(
        {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0, "stream": False}
    ).encode()


def _one(
    endpoint: str, model: str, key: str | None, timeout_s: float, context: ssl.SSLContext | None
) -> ProbeResult:
    headers = {"Content-Type": "application/json", "User-Agent": "frontier-probe"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        endpoint.rstrip("/") + PROBE_PATH, data=probe_body(model), headers=headers, method="POST"
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        latency = (time.perf_counter() - started) * 1000
        detail = exc.read()[:200].decode(errors="replace")
        return ProbeResult(False, latency, model, exc.code, f"HTTP {exc.code}: {detail}")
    except (OSError, ValueError) as exc:  # refused, reset, timed out, TLS, a bad URL
        latency = (time.perf_counter() - started) * 1000
        return ProbeResult(False, latency, model, 0, f"{type(exc).__name__}: {exc}")
    latency = (time.perf_counter() - started) * 1000
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not choices:
        return ProbeResult(False, latency, model, status, "the answer carries no choice")
    return ProbeResult(True, latency, model, status)


def probe(
    endpoint: str,
    models: Sequence[str],
    key: str | Mapping[str, str] | None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> ProbeResult:
    """The fixed request to each model in turn, with ``key`` (one for every model, or each model's
    own by name); the first failure, else the slowest success."""
    if not models:
        raise ValueError("the probe needs at least one model name")
    keys = key if isinstance(key, Mapping) else dict.fromkeys(models, key)
    results = [_one(endpoint, model, keys.get(model), timeout_s, context) for model in models]
    failed = [r for r in results if not r.ok]
    return failed[0] if failed else max(results, key=lambda r: r.latency_ms)


def metric_data(stack: str, result: ProbeResult) -> list[dict[str, Any]]:
    """What one run publishes: success (1/0) and latency, under the stack."""
    dimensions = [{"Name": STACK_DIMENSION, "Value": stack}]
    return [
        {
            "MetricName": PROBE_SUCCESS_CW_METRIC,
            "Dimensions": dimensions,
            "Value": 1.0 if result.ok else 0.0,
            "Unit": "Count",
        },
        {
            "MetricName": PROBE_LATENCY_CW_METRIC,
            "Dimensions": dimensions,
            "Value": round(result.latency_ms, 3),
            "Unit": "Milliseconds",
        },
    ]


def publish(cloudwatch: Any, stack: str, result: ProbeResult) -> None:
    """Put one run's figures with a boto3 CloudWatch client."""
    cloudwatch.put_metric_data(Namespace=CLOUDWATCH_NAMESPACE, MetricData=metric_data(stack, result))


def key_from_secret(value: str) -> str:
    """A client key from a secret's string: the runtime's key set ``{"keys": [first, ...]}`` (the
    first is the one clients are given) or the key itself."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value.strip()
    if isinstance(parsed, dict) and isinstance(parsed.get("keys"), list) and parsed["keys"]:
        return str(parsed["keys"][0])
    raise ValueError('the probe key secret holds neither {"keys": [...]} nor a plain key')


def key_secrets(env: Mapping[str, str], models: Sequence[str]) -> dict[str, str]:
    """Each model's key secret from :data:`KEY_SECRET_ENV`: one secret for every model, or one per
    model in the order of :data:`MODELS_ENV`; none where it is not set."""
    secrets = [s for s in env.get(KEY_SECRET_ENV, "").split(",") if s]
    if not secrets:
        return {}
    if len(secrets) == 1:
        return dict.fromkeys(models, secrets[0])
    if len(secrets) != len(models):
        raise ValueError(
            f"{KEY_SECRET_ENV} names {len(secrets)} secrets for {len(models)} models: one, or one per model"
        )
    return dict(zip(models, secrets, strict=True))


def settings_from(env: Mapping[str, str]) -> tuple[str, list[str], str, float]:
    """Endpoint, models, stack and timeout from the environment the Lambda is given."""
    missing = [name for name in (ENDPOINT_ENV, MODELS_ENV, STACK_ENV) if not env.get(name)]
    if missing:
        raise ValueError("the probe needs " + ", ".join(missing))
    models = [m for m in env[MODELS_ENV].split(",") if m]
    timeout = float(env.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    return env[ENDPOINT_ENV], models, env[STACK_ENV], timeout


def main(argv: list[str] | None = None) -> int:
    """The CronJob's command: probe once, print the outcome as one JSON line, exit 0 or 1."""
    parser = argparse.ArgumentParser(prog="frontier-probe", description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", default=os.environ.get(ENDPOINT_ENV, ""))
    parser.add_argument("--models", default=os.environ.get(MODELS_ENV, ""))
    parser.add_argument(
        "--timeout", type=float, default=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    )
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not args.endpoint or not models:
        parser.error(f"--endpoint and --models (or {ENDPOINT_ENV} and {MODELS_ENV}) are required")
    result = probe(args.endpoint, models, os.environ.get(KEY_ENV) or None, args.timeout)
    print(json.dumps(asdict(result)), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
