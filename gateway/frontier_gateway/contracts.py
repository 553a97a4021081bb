"""Names that code outside the gateway reads: paths, headers, the body field it sets, metric names.

The toolkit (``fab usage``, ``fab batch``, the demo, dashboards) and the runtime agree with these.
``PRIORITY_CLASSES`` and ``PRIORITY_FIELD`` are the runtime's (``frontier_runtime.contracts``),
repeated here because the gateway does not install the runtime; a test keeps the two equal.
Imports nothing.
"""

from __future__ import annotations

# --- paths ---------------------------------------------------------------------------------------
COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
READINESS_PATH = "/health/ready"
LIVENESS_PATH = "/health/live"

# --- what the gateway tells the runtime ---------------------------------------------------------
PRIORITY_FIELD = "priority"
INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITY_CLASSES = (INTERACTIVE, BATCH)

# --- EC2 discovery: the toolkit's tags on runtime hosts (frontier.contracts; a test keeps them equal)
STACK_TAG = "frontier:stack"
NODE_GROUP_TAG = "frontier:node-group"
ROLE_TAG = "frontier:role"
RUNTIME_ROLE = "runtime"

# --- headers -------------------------------------------------------------------------------------
SESSION_HEADER = "x-session-id"  # the default affinity header
REQUEST_ID_HEADER = "x-request-id"
REPLICA_HEADER = "x-frontier-replica"  # which replica answered (for clients that debug affinity)
# OpenAI's rate-limit headers, on every answer to an authenticated request.
LIMIT_REQUESTS = "x-ratelimit-limit-requests"
LIMIT_TOKENS = "x-ratelimit-limit-tokens"
REMAINING_REQUESTS = "x-ratelimit-remaining-requests"
REMAINING_TOKENS = "x-ratelimit-remaining-tokens"
RESET_REQUESTS = "x-ratelimit-reset-requests"
RESET_TOKENS = "x-ratelimit-reset-tokens"

# --- metrics (Prometheus family names; counters get _total) --------------------------------------
TENANT_LABEL = "tenant"
MODEL_LABEL = "model"
REQUESTS_METRIC = "frontier_gateway_requests"  # counter {tenant, model, status}
DURATION_METRIC = "frontier_gateway_request_duration_seconds"  # histogram {tenant, model}
TTFT_METRIC = "frontier_gateway_time_to_first_token_seconds"  # histogram {tenant, model}
TOKENS_METRIC = "frontier_gateway_tokens"  # counter {tenant, model, kind=prompt|completion}
RATE_LIMITED_METRIC = "frontier_gateway_rate_limited"  # counter {tenant, limit}
IN_FLIGHT_METRIC = "frontier_gateway_in_flight"  # gauge {tenant}
RETRIES_METRIC = "frontier_gateway_retries"  # counter {model}
REPLICA_READY_METRIC = "frontier_gateway_replica_ready"  # gauge {model, replica}
REPLICA_OUTSTANDING_METRIC = "frontier_gateway_replica_outstanding"  # gauge {model, replica}
