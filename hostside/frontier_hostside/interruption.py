"""Spot notices: the host agent's ``interruptions`` command (:class:`InterruptionWatcher`).

Standard library only, Python 3.8 and later: it travels beside ``frontier-agent.py``
(``frontier_hostside.IMPORTED_FILES``).

EC2 tells a spot instance it is going through the instance metadata service (IMDSv2: a token from
``PUT /latest/api/token``, then GETs carrying it): ``meta-data/spot/instance-action`` answers 404
until AWS decides to reclaim the host, then ``{"action": "terminate", "time": ...}`` two minutes
before it does; ``meta-data/events/recommendations/rebalance`` answers ``{"noticeTime": ...}`` when
the host's capacity pool is at elevated risk, often well before that. The watcher asks both every
``interval_s`` (5 s by default) and, on a notice:

* **spot instance-action** → the host goes out of service at once: the agent stops the runtime
  (SIGTERM through the supervisor, or ``systemctl stop`` where systemd runs it), so readiness fails
  from that instant — the load balancer's readiness checks drop the host, the gateway's prober marks
  the replica not ready (a draining replica, whose in-flight generations the gateway may move), and
  requests still in flight finish within the runtime's drain timeout, before the two minutes end.
  Before that, each gateway named (``gateway_admin``: its admin address) is told on
  ``names.GATEWAY_INTERRUPT_PATH`` that this replica is interrupted, so it takes the replica out of
  rotation and moves the generations it serves to other replicas at once, rather than waiting for
  them to finish here; a gateway that cannot be reached is logged and the drain goes on.
* **rebalance recommendation** → recorded and logged; the host keeps serving unless
  ``drain_on_rebalance``. Why: with capacity rebalancing on, the auto scaling group answers the same
  signal by launching a replacement first and terminating this host after it is in service, through
  the terminate lifecycle hook whose ``watch`` drains the host; draining here as well would remove a
  replica before its replacement serves.

Each notice is handled once (by its kind and time), written to ``run/interruption.json`` (what
``status`` and an operator read) and as a line in ``logs/agent.jsonl``, and printed on stderr.
The IMDS URL is a setting (``--imds``, or ``FRONTIER_IMDS_URL``): the real default is AWS's
link-local address; tests and the local stack point it at a stand-in on loopback.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from frontier_hostside.names import GATEWAY_INTERRUPT_PATH
from frontier_hostside.processes import atomic_write, now

IMDS_URL = "http://169.254.169.254"
IMDS_URL_ENV = "FRONTIER_IMDS_URL"
POLL_INTERVAL_S = 5.0
TOKEN_TTL_S = 21600
# A token is renewed this long before it expires, so no GET carries one that lapses on the way.
TOKEN_MARGIN_S = 60.0
SPOT_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
RECORD_NAME = "interruption.json"
SPOT = "spot"
REBALANCE = "rebalance"


class ImdsError(Exception):
    """IMDS answered something other than a value or a 404."""


@dataclass(frozen=True)
class Notice:
    """One notice from IMDS: ``kind`` is spot or rebalance; ``at`` the time IMDS gives with it."""

    kind: str
    action: str  # terminate, stop or hibernate for spot; "rebalance" for a recommendation
    at: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.action, self.at)


class Imds:
    """IMDSv2 at ``url``: a session token, renewed before it lapses, on every GET."""

    def __init__(self, url: str = IMDS_URL, timeout_s: float = 2.0, ttl_s: int = TOKEN_TTL_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._token = ""
        self._token_until = 0.0
        # IMDS is on the host itself: never through a proxy, whatever http_proxy says.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _request(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), ""
        except (OSError, ValueError) as exc:
            raise ImdsError(f"{request.full_url}: {exc}") from None

    def token(self) -> str:
        if not self._token or time.monotonic() >= self._token_until:
            request = urllib.request.Request(
                f"{self.url}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.ttl_s)},
            )
            status, body = self._request(request)
            if status != 200 or not body:
                raise ImdsError(f"PUT {self.url}/latest/api/token answered {status}")
            self._token = body.strip()
            self._token_until = time.monotonic() + max(1.0, self.ttl_s - TOKEN_MARGIN_S)
        return self._token

    def get(self, path: str) -> str | None:
        """The value at ``path``, or None where IMDS answers 404 (no such notice)."""
        for attempt in (1, 2):
            request = urllib.request.Request(
                f"{self.url}{path}", headers={"X-aws-ec2-metadata-token": self.token()}
            )
            status, body = self._request(request)
            if status == 200:
                return body
            if status == 404:
                return None
            if status == 401 and attempt == 1:
                self._token = ""  # revoked or expired early: one fresh token, then give up
                continue
            raise ImdsError(f"GET {self.url}{path} answered {status}")
        return None

    def notices(self) -> list[Notice]:
        """The notices IMDS holds now: a spot instance-action, a rebalance recommendation, both or none."""
        found: list[Notice] = []
        spot = self.get(SPOT_ACTION_PATH)
        if spot is not None:
            data = _json_object(spot, SPOT_ACTION_PATH)
            found.append(Notice(SPOT, str(data.get("action", "terminate")), str(data.get("time", ""))))
        rebalance = self.get(REBALANCE_PATH)
        if rebalance is not None:
            data = _json_object(rebalance, REBALANCE_PATH)
            found.append(Notice(REBALANCE, REBALANCE, str(data.get("noticeTime", ""))))
        return found


def _json_object(text: str, path: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise ImdsError(f"{path} is not JSON: {text[:80]!r}") from None
    if not isinstance(data, dict):
        raise ImdsError(f"{path} is not a JSON object: {text[:80]!r}")
    return data


class AgentConfigView(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...


class DrainableHost(Protocol):
    """The agent (``Agent``) as the watcher uses it."""

    @property
    def config(self) -> AgentConfigView: ...

    run_dir: Path
    history_file: Path

    def stop(self) -> dict[str, Any]: ...


class InterruptionWatcher:
    """Polls IMDS every ``interval_s`` and takes the host out of service on a spot notice."""

    def __init__(
        self,
        host: DrainableHost,
        imds: Imds,
        interval_s: float = POLL_INTERVAL_S,
        drain_on_rebalance: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        gateway_admin: tuple[str, ...] = (),
    ) -> None:
        if not 0.05 <= interval_s <= 60:
            raise ValueError(f"interval_s is {interval_s:g}; it must be between 0.05 and 60")
        self.host = host
        self.imds = imds
        self.interval_s = interval_s
        self.drain_on_rebalance = drain_on_rebalance
        self.sleep = sleep
        self.gateway_admin = tuple(url.rstrip("/") for url in gateway_admin)
        # What the gateways know this host's runtime by: its base URL.
        self.replica_url = f"http://{host.config.address}:{host.config.port}"
        self.handled: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.record_file = host.run_dir / RECORD_NAME
        self.errors = 0

    def poll_once(self) -> list[dict[str, Any]]:
        """One look at IMDS; what was done for each notice not seen before."""
        try:
            notices = self.imds.notices()
        except ImdsError as exc:
            # An unreachable IMDS is logged and asked again next round; it is never a notice.
            self.errors += 1
            self._log({"event": "imds_error", "error": str(exc)})
            return []
        done = []
        for notice in notices:
            if notice.key in self.handled:
                continue
            done.append(self.handle(notice))
        return done

    def handle(self, notice: Notice) -> dict[str, Any]:
        seen = time.time()
        drain = notice.kind == SPOT or self.drain_on_rebalance
        entry: dict[str, Any] = {
            "event": "interruption_notice",
            "notice": asdict(notice),
            "seen_at": now(),
            "out_of_service": drain,
        }
        self.handled[notice.key] = entry
        if drain:
            entry["out_of_service_at"] = now()
            # The record first: a status read while the drain runs already says why.
            self._record()
            self._log(entry)
            if self.gateway_admin:
                entry["gateways"] = [self._tell_gateway(url) for url in self.gateway_admin]
            stopped = self.host.stop()
            entry["stop"] = stopped
            entry["drained_after_s"] = round(time.time() - seen, 3)
            self._log({"event": "interruption_drained", "notice": asdict(notice), "stop": stopped,
                       "drained_after_s": entry["drained_after_s"]})  # fmt: skip
        else:
            self._log(entry)
        self._record()
        return entry

    def run(self, rounds: int = 0) -> dict[str, Any]:
        """Poll until stopped (``rounds`` > 0: that many polls, for tests and one-off checks)."""
        done = 0
        while rounds <= 0 or done < rounds:
            started = time.monotonic()
            self.poll_once()
            done += 1
            if rounds > 0 and done >= rounds:
                break
            self.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        return {
            "polls": done,
            "errors": self.errors,
            "notices": [entry["notice"] for entry in self.handled.values()],
            "out_of_service": any(entry["out_of_service"] for entry in self.handled.values()),
        }

    def _tell_gateway(self, admin_url: str) -> dict[str, Any]:
        """POST the interrupt to one gateway's admin address; what it answered (or why not)."""
        url = admin_url + GATEWAY_INTERRUPT_PATH
        body = json.dumps({"replica": self.replica_url}).encode()
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=5) as response:
                answer: dict[str, Any] = {"gateway": admin_url, "status": int(response.status)}
                answer.update(json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            answer = {
                "gateway": admin_url,
                "status": int(exc.code),
                "error": exc.read().decode(errors="replace")[:200],
            }
        except (OSError, ValueError) as exc:
            answer = {"gateway": admin_url, "status": 0, "error": str(exc)}
        self._log({"event": "gateway_told", **answer})
        return answer

    def _record(self) -> None:
        """Every notice handled so far, the latest included, in ``run/interruption.json``."""
        self.host.run_dir.mkdir(parents=True, exist_ok=True)
        entries = list(self.handled.values())
        atomic_write(self.record_file, json.dumps({"notices": entries}, sort_keys=True) + "\n")

    def _log(self, line: dict[str, Any]) -> None:
        full = {"at": now(), "host": self.host.config.host, **line}
        text = json.dumps(full, sort_keys=True)
        self.host.history_file.parent.mkdir(parents=True, exist_ok=True)
        with self.host.history_file.open("a") as out:
            out.write(text + "\n")
        print(text, file=sys.stderr, flush=True)


def read_record(run_dir: Path) -> list[dict[str, Any]]:
    """The notices this host has handled (``run/interruption.json``), oldest first; [] when none."""
    try:
        data = json.loads((run_dir / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return []
    notices = data.get("notices") if isinstance(data, dict) else None
    return list(notices) if isinstance(notices, list) else []
