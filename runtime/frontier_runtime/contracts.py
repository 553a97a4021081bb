"""Names that code outside the runtime reads: metric names and labels on /metrics, and HTTP paths.

The toolkit's rollout gate, alert rules and dashboards match on these strings, so each is defined
here once and the server uses the constant. Renaming one breaks its readers. Imports nothing.

Metric names are Prometheus family names: the exposition adds ``_total`` to counters and
``_bucket``, ``_sum``, ``_count`` to histograms. The ``vllm:`` names match vLLM's, so dashboards
built for vLLM work unchanged.
"""

from __future__ import annotations

# --- HTTP paths ----------------------------------------------------------------------------------
COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
# Defaults of runtime.yaml's health.readiness_path and health.liveness_path.
DEFAULT_READINESS_PATH = "/health/ready"
DEFAULT_LIVENESS_PATH = "/health/live"

# --- request priority ----------------------------------------------------------------------------
# The classes a request may carry in its ``priority`` body field (the gateway sets it from the
# tenant's class): batch runs only on capacity interactive work leaves free and is preempted first.
PRIORITY_FIELD = "priority"
INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITY_CLASSES = (INTERACTIVE, BATCH)

# --- metric labels -------------------------------------------------------------------------------
MODEL_LABEL = "model_name"
ROUTE_LABEL = "route"  # an app route, or OTHER_ROUTE for any path the app does not serve
STATUS_LABEL = "status"  # the HTTP status as text; "499" when the client left before an answer
REASON_LABEL = "reason"
FINISHED_REASON_LABEL = "finished_reason"
OTHER_ROUTE = "other"

# --- HTTP traffic: the rollout gate's error rate and p99 -------------------------------------------
HTTP_REQUESTS_METRIC = "frontier_http_requests"  # counter {route, status}
HTTP_DURATION_METRIC = "frontier_http_request_duration_seconds"  # histogram {route}
REQUEST_FAILURES_METRIC = "frontier_request_failures"  # counter {reason}

# --- requests (histograms and counters by model_name) ----------------------------------------------
PROMPT_TOKENS_METRIC = "vllm:prompt_tokens"
GENERATION_TOKENS_METRIC = "vllm:generation_tokens"
REQUEST_SUCCESS_METRIC = "vllm:request_success"  # counter {model_name, finished_reason}
TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"
TPOT_METRIC = "vllm:request_time_per_output_token_seconds"
E2E_LATENCY_METRIC = "vllm:e2e_request_latency_seconds"
QUEUE_TIME_METRIC = "vllm:request_queue_time_seconds"
REQUEST_PROMPT_TOKENS_METRIC = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS_METRIC = "vllm:request_generation_tokens"

# --- engine and server state, read at scrape time (by model_name) ----------------------------------
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
PREEMPTIONS_METRIC = "vllm:num_preemptions"
PREFIX_CACHE_QUERIES_METRIC = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS_METRIC = "vllm:prefix_cache_hits"
BATCH_SIZE_METRIC = "frontier_batch_size"
STEP_TOKENS_METRIC = "frontier_step_tokens"
ENGINE_STEPS_METRIC = "frontier_engine_steps"
KV_BLOCKS_TOTAL_METRIC = "frontier_kv_blocks_total"
KV_BLOCKS_FREE_METRIC = "frontier_kv_blocks_free"
ADMITTED_METRIC = "frontier_admitted_requests"
QUEUED_METRIC = "frontier_queued_requests"
READY_METRIC = "frontier_ready"
DRAINING_METRIC = "frontier_draining"

METRIC_NAMES = (
    HTTP_REQUESTS_METRIC,
    HTTP_DURATION_METRIC,
    REQUEST_FAILURES_METRIC,
    PROMPT_TOKENS_METRIC,
    GENERATION_TOKENS_METRIC,
    REQUEST_SUCCESS_METRIC,
    TTFT_METRIC,
    ITL_METRIC,
    TPOT_METRIC,
    E2E_LATENCY_METRIC,
    QUEUE_TIME_METRIC,
    REQUEST_PROMPT_TOKENS_METRIC,
    REQUEST_GENERATION_TOKENS_METRIC,
    RUNNING_METRIC,
    WAITING_METRIC,
    KV_USAGE_METRIC,
    PREEMPTIONS_METRIC,
    PREFIX_CACHE_QUERIES_METRIC,
    PREFIX_CACHE_HITS_METRIC,
    BATCH_SIZE_METRIC,
    STEP_TOKENS_METRIC,
    ENGINE_STEPS_METRIC,
    KV_BLOCKS_TOTAL_METRIC,
    KV_BLOCKS_FREE_METRIC,
    ADMITTED_METRIC,
    QUEUED_METRIC,
    READY_METRIC,
    DRAINING_METRIC,
)
