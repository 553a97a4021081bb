"""The verification of a disaggregated pool's decode hosts through a prefill host: the pair answering.

A decode runtime asked directly computes the prompt itself, so the verification set sent straight
to it proves the decode alone. Once the prefill group runs the new release, the decode's canary is
verified as the gateway serves a request (``gateway/frontier_gateway/disaggregation.py``): each
case's request goes first to a prefill host, with ``max_tokens: 1`` and ``kv_transfer_params:
{do_remote_decode: true}``, and then, with the ``kv_transfer_params`` the prefill answered, to the
decode host, which pulls the prompt's blocks and answers. A prefill hop that fails or names no
blocks fails the case, saying so: the pair did not answer together. The greedy cases are held to
the recording the prefill's canary made of the old release.

Each host is reached as every canary is, through an SSH tunnel to its runtime port; the two hops
are joined by :func:`two_hops`, a relay on the operator's loopback for the length of one run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from frontier.rollout.canary import CanaryVerification, tunnel
from frontier.verify import VerifyReport

# Fields of a client's request that do not apply to the one-token prefill hop (the gateway's own).
PREFILL_DROPS = ("stream", "stream_options", "max_completion_tokens", "n", "logprobs", "top_logprobs")
HOP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PairedVerification(CanaryVerification):
    """A canary verification whose every case reaches the runtime it judges through the prefill
    runtime at ``prefill_address``, reached over ``prefill_conn`` (that host's SSH connection)."""

    prefill_conn: Any = None
    prefill_address: str = ""

    def run_at(self, url: str) -> VerifyReport:
        with (
            tunnel(self.prefill_conn, self.prefill_address, self.runtime_port) as prefill_url,
            two_hops(prefill_url, url) as paired,
        ):
            return super().run_at(paired)


def through_prefill(check: CanaryVerification, conn: Any, address: str) -> PairedVerification:
    """``check``, its cases sent through the prefill runtime at ``address`` (reached over ``conn``)."""
    same = {field.name: getattr(check, field.name) for field in dataclasses.fields(check)}
    return PairedVerification(**same, prefill_conn=conn, prefill_address=address)


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _refused(handler: BaseHTTPRequestHandler, why: str) -> None:
    body = json.dumps({"error": {"message": f"the pair did not answer together: {why}"}}).encode()
    _reply(handler, 502, body, "application/json")


@contextlib.contextmanager
def two_hops(prefill_url: str, decode_url: str) -> Iterator[str]:
    """A local URL where a request goes to ``prefill_url`` first and then, with the blocks it names,
    to ``decode_url``, whose answer comes back; anything but a completion goes to the decode only."""

    class Relay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _headers(self) -> dict[str, str]:
            auth = self.headers.get("Authorization")
            return {"content-type": "application/json", **({"authorization": auth} if auth else {})}

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            answer = client.get(decode_url + self.path, headers=self._headers())
            _reply(self, answer.status_code, answer.content, answer.headers.get("content-type", ""))

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                request = json.loads(body)
            except ValueError:
                request = None
            if not isinstance(request, dict) or not self.path.endswith("completions"):
                answer = client.post(decode_url + self.path, content=body, headers=self._headers())
                _reply(self, answer.status_code, answer.content, answer.headers.get("content-type", ""))
                return
            first = {k: v for k, v in request.items() if k not in PREFILL_DROPS}
            first.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
            try:
                prefilled = client.post(prefill_url + self.path, json=first, headers=self._headers())
            except httpx.HTTPError as exc:
                return _refused(self, f"the prefill hop failed: {type(exc).__name__}: {exc}")
            if prefilled.status_code != 200:
                return _refused(
                    self, f"the prefill hop answered {prefilled.status_code}: {prefilled.text[:200]}"
                )
            try:
                params = prefilled.json().get("kv_transfer_params")
            except (ValueError, AttributeError):
                params = None
            if not isinstance(params, dict) or not params.get("do_remote_prefill"):
                return _refused(self, "the prefill hop answered no kv_transfer_params naming its blocks")
            request["kv_transfer_params"] = params
            try:
                answer = client.post(decode_url + self.path, json=request, headers=self._headers())
            except httpx.HTTPError as exc:
                return _refused(self, f"the decode hop failed: {type(exc).__name__}: {exc}")
            _reply(self, answer.status_code, answer.content, answer.headers.get("content-type", ""))

    with httpx.Client(timeout=HOP_TIMEOUT_S) as client:
        server = ThreadingHTTPServer(("127.0.0.1", 0), Relay)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
