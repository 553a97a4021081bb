"""Metering: one JSON line per answered request (tenant, model, tokens from the runtime's usage,
latency), appended to a local file or written to S3 in batches, for ``fab usage`` to sum."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("frontier_gateway.metering")


@dataclass(frozen=True)
class MeterRecord:
    time: float  # unix seconds when the answer ended
    request_id: str  # the gateway's own (a uuid): the key of the record
    tenant: str
    model: str
    priority: str
    status: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    ttft_ms: float | None
    stream: bool
    replica: str  # its base URL: these records are the operator's, not the tenant's
    # What the client called it, if anything short and plain; never the key.
    client_request_id: str | None = None

    def to_line(self) -> str:
        # The fields are all plain values: vars() is the same mapping as asdict() without its
        # recursive deep copy, which cost more than the JSON encoding on every request.
        return json.dumps(vars(self), separators=(",", ":"))


class Sink(Protocol):
    def write(self, record: MeterRecord) -> None: ...
    def flush(self) -> None: ...


class FileSink:
    """Appends each record as it is written (one write per line, so lines never interleave)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)

    def write(self, record: MeterRecord) -> None:
        os.write(self._fd, (record.to_line() + "\n").encode())

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class S3Sink:
    """Buffers records and writes one object per flush: ``<prefix>/<gateway>/<time>-<n>.jsonl``."""

    def __init__(self, uri: str, client: Any | None = None) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.instance = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._client = client
        self._buffer: list[str] = []
        self._count = 0

    def write(self, record: MeterRecord) -> None:
        self._buffer.append(record.to_line())

    def flush(self) -> None:
        if not self._buffer:
            return
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        lines, self._buffer = self._buffer, []
        self._count += 1
        key = "/".join(p for p in (self.prefix, self.instance, f"{time.time():.3f}-{self._count}.jsonl") if p)
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=("\n".join(lines) + "\n").encode())
        except Exception:
            # Keep the records for the next flush rather than lose them.
            self._buffer = lines + self._buffer
            log.exception(
                "metering flush failed", extra={"event": "metering_flush_failed", "records": len(lines)}
            )

    def close(self) -> None:
        self.flush()


def open_sink(uri: str) -> FileSink | S3Sink:
    return S3Sink(uri) if uri.startswith("s3://") else FileSink(uri)


async def flush_forever(sink: Sink, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(sink.flush)
