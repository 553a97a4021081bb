"""Rotate the runtimes' API key without a restart: add, wait until every replica serves it, retire.

The runtimes (and the gateway, whose upstream key is the secret's first) read the secret again
every reload interval. A rotation therefore only writes the secret and watches:

1. add: write ``{"keys": [*old, new]}``; the first key, the one clients use, is still the old one;
2. wait until every replica reports the fingerprint of that set (``frontier_api_keys_info`` on its
   ``/metrics``, a hash of the keys' digests: no key, nor a digest of one, leaves a runtime);
3. publish: write ``{"keys": [new, *old]}`` (the same set, so no replica changes), and whoever takes
   the first key (the gateway, clients that read the secret) moves to the new key, which every
   replica already accepts;
4. wait the overlap window: long enough for the slowest of those readers to move over;
5. retire: write ``{"keys": [new]}`` and wait until every replica reports that set.

Nothing here knows the target: the caller hands one ``Replica`` per runtime, each with a way to
read that runtime's metrics (through the host's session on every target).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from frontier_hostside import names
from frontier_runtime.server.auth import fingerprint_of
from frontier_runtime.storage.secrets import parse_keys

_INFO_LINE = re.compile(
    rf'^{re.escape(names.API_KEYS_INFO_METRIC)}\{{[^}}]*{names.KEYS_FINGERPRINT_LABEL}="([0-9a-f]+)"[^}}]*\}}\s'
)
POLL_S = 1.0


class RotationError(RuntimeError):
    """A rotation could not finish; the message says which step, which replicas, and what the secret holds."""


@dataclass(frozen=True)
class Replica:
    name: str
    metrics: Callable[[], str]  # the runtime's /metrics text


@dataclass
class Step:
    what: str
    fingerprint: str
    seconds: float
    replicas: dict[str, float] = field(default_factory=dict)  # replica -> seconds until it served the set


@dataclass
class Rotation:
    secret_id: str
    steps: list[Step] = field(default_factory=list)
    retired: int = 0  # how many old keys were retired


def timing_problems(wait_s: float, overlap_s: float, reload_s: float, reload_field: str) -> list[str]:
    """Why these timings cannot work, one line per field; empty when they can."""
    problems = []
    if not wait_s > 0:
        problems.append(f"--wait-s {wait_s:g}: must be > 0")
    elif wait_s < reload_s:
        problems.append(
            f"--wait-s {wait_s:g}: must be >= {reload_field} ({reload_s:g}): a replica reads the secret only that often"
        )
    if overlap_s < reload_s:
        problems.append(
            f"--overlap-s {overlap_s:g}: must be >= {reload_field} ({reload_s:g}): whoever uses the "
            "secret's first key needs one reload to move to the new key before the old one is refused"
        )
    return problems


def served_fingerprint(metrics_text: str) -> str | None:
    """The key-set fingerprint a runtime reports, or None (auth off, or a runtime without reloads)."""
    for line in metrics_text.splitlines():
        match = _INFO_LINE.match(line)
        if match:
            return match.group(1)
    return None


def new_key() -> str:
    return "sk-" + secrets.token_urlsafe(32)


def rotate(
    client: Any,
    secret_id: str,
    replicas: Sequence[Replica],
    *,
    wait_s: float,
    overlap_s: float,
    progress: Callable[[str], None] = lambda _line: None,
    sleep: Callable[[float], None] = time.sleep,
    make_key: Callable[[], str] = new_key,
) -> Rotation:
    if not replicas:
        raise RotationError(
            "no replica to watch: the stack serves nothing, so nothing can confirm the new key"
        )
    old = parse_keys(client.get_secret_value(SecretId=secret_id)["SecretString"], secret_id)
    key = make_key()
    rotation = Rotation(secret_id)

    added = (*old, key)
    _write(client, secret_id, added)
    progress(
        f"added a new key to {secret_id} ({len(old)} old kept first); waiting for {len(replicas)} replicas"
    )
    rotation.steps.append(
        _wait_for(replicas, fingerprint_of(added), "new key served", wait_s, progress, sleep)
    )

    # Only now that every replica accepts it does the new key become the one clients use.
    _write(client, secret_id, (key, *old))
    progress(f"published: the new key is first in {secret_id}; both keys work for {overlap_s:g} s")
    sleep(overlap_s)

    _write(client, secret_id, (key,))
    progress(f"retired {len(old)} old key(s) from {secret_id}; waiting for {len(replicas)} replicas")
    rotation.steps.append(
        _wait_for(replicas, fingerprint_of((key,)), "old key refused", wait_s, progress, sleep)
    )
    rotation.retired = len(old)
    return rotation


def _write(client: Any, secret_id: str, keys: Sequence[str]) -> None:
    client.put_secret_value(SecretId=secret_id, SecretString=json.dumps({"keys": list(keys)}))


def _wait_for(
    replicas: Sequence[Replica],
    fingerprint: str,
    what: str,
    wait_s: float,
    progress: Callable[[str], None],
    sleep: Callable[[float], None],
) -> Step:
    started = time.monotonic()
    step = Step(what, fingerprint, 0.0)
    last: dict[str, str] = {}
    while True:
        for replica in replicas:
            if replica.name in step.replicas:
                continue
            try:
                seen = served_fingerprint(replica.metrics()) or "none"
            except Exception as exc:  # noqa: BLE001 - an unreachable replica is waited for, then named
                seen = f"unreachable ({type(exc).__name__})"
            if seen == fingerprint:
                step.replicas[replica.name] = round(time.monotonic() - started, 1)
                progress(f"  {replica.name}: serves {fingerprint} after {step.replicas[replica.name]:g} s")
            elif last.get(replica.name) != seen:
                progress(f"  {replica.name}: serves {seen}, waiting for {fingerprint}")
            last[replica.name] = seen
        if len(step.replicas) == len(replicas):
            step.seconds = round(time.monotonic() - started, 1)
            return step
        if time.monotonic() - started > wait_s:
            lagging = ", ".join(
                f"{r.name} ({last.get(r.name)})" for r in replicas if r.name not in step.replicas
            )
            raise RotationError(
                f"{what}: not every replica serves {fingerprint} after {wait_s:g} s: {lagging}"
            )
        sleep(POLL_S)
