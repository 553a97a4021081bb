"""The synthetic probe in the runtime's image: what a stack's Kubernetes CronJob runs every minute.

``frontier_hostside.probe`` sends the fixed request and reports; this adds what the image has and
the host side must not import: the key, read from the runtime's own Secrets Manager secret
(``FRONTIER_PROBE_KEY_SECRET``) with the pod's identity, the first key being the one clients hold.
Exit 0 when the probe succeeds, 1 when it fails (the CronJob's job status is the outcome), 2 when
it cannot run; one JSON line either way.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from frontier_hostside.probe import KEY_ENV, KEY_SECRET_ENV, probe, settings_from

from frontier_runtime.storage.secrets import SecretsError, load_api_keys


def main() -> int:
    try:
        endpoint, models, _stack, timeout = settings_from(os.environ)
        key = os.environ.get(KEY_ENV) or None
        if key is None and os.environ.get(KEY_SECRET_ENV):
            key = load_api_keys(os.environ[KEY_SECRET_ENV])[0]
    except (ValueError, SecretsError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
        return 2
    result = probe(endpoint, models, key, timeout)
    print(json.dumps(asdict(result)), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
