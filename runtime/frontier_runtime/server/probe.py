"""A health probe for container engines: ``python -m frontier_runtime probe [--ready]``.

The server writes where it listens to ``$FRONTIER_PROBE_FILE`` once its socket is open, so the
probe follows ``--port`` overrides, port 0 and custom health paths without reading the config.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

PROBE_FILE_ENV = "FRONTIER_PROBE_FILE"


def probe_file() -> Path | None:
    value = os.environ.get(PROBE_FILE_ENV)
    return Path(value) if value else None


def write_probe_file(host: str, port: int, liveness_path: str, readiness_path: str) -> None:
    path = probe_file()
    if path is None:
        return
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    base = f"http://[{local}]:{port}" if ":" in local else f"http://{local}:{port}"
    data = {"pid": os.getpid(), "url": base, "liveness_path": liveness_path, "readiness_path": readiness_path}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def remove_probe_file() -> None:
    path = probe_file()
    if path is not None:
        path.unlink(missing_ok=True)


def run_probe(ready: bool = False, timeout_s: float = 3.0) -> tuple[bool, str]:
    """(healthy, why) for the server described by the probe file."""
    path = probe_file()
    if path is None:
        return False, f"{PROBE_FILE_ENV} is not set"
    try:
        info = json.loads(path.read_text())
        url = info["url"] + info["readiness_path" if ready else "liveness_path"]
    except (OSError, ValueError, KeyError) as exc:
        return False, f"no server has announced itself in {path}: {exc}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200, f"{url}: {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code} {exc.read()[:200].decode(errors='replace')}"
    except OSError as exc:
        return False, f"{url}: {exc}"
