"""Names that the toolkit, the runtime, the gateway and the host tools must agree on, each defined once.

The Pulumi program tags hosts that ``fab`` and the gateway discover and the policy pack checks; the
toolkit renders paths that the host agent, the bootstrap and the systemd units use; the rollout
gate, the alert rules, the autoscalers and the CloudWatch alarms read metrics the runtime exports;
the gateway sets the priority field the runtime schedules by. A name that lives here is imported by
all of them; none of them spells it again.

Imports only the standard library and runs on the hosts' own ``python3`` (3.8 and later): it travels
beside the host agent and the bootstrap (see :func:`frontier_hostside.host_tools`).
"""

from __future__ import annotations

import re

# --- tags: infra/ writes them; the toolkit's inventory and the gateway discover by them; ----------
# policy/ requires them
TAG_PREFIX = "frontier:"
STACK_TAG = "frontier:stack"
NODE_GROUP_TAG = "frontier:node-group"
ROLE_TAG = "frontier:role"
PURPOSE_TAG = "frontier:purpose"
MANAGED_BY_TAG = "frontier:managed-by"
RUNTIME_ROLE = "runtime"
DISCOVERY_TAGS = (STACK_TAG, NODE_GROUP_TAG, ROLE_TAG)

# --- host layout: render/ writes it, fleet/, the host agent and the bootstrap use it ----------------
HOST_ROOT = "/opt/frontier"
# The uid and gid the runtime image runs as (runtime/Dockerfile's useradd --uid): the unit's --user,
# the owner of the weights cache a host prepares, a pod's runAsUser by default.
RUNTIME_UID = 10001
CACHE_MOUNT = "/var/cache/frontier"
# Where a cloud host keeps verified weights (the mounted model-cache volume).
CLOUD_WEIGHTS_CACHE = f"{CACHE_MOUNT}/weights"
CONTAINER_RELEASE_DIR = "/etc/frontier/release"
# Inside the runtime container, whose root is read-only (the unit's --read-only, the pod's
# readOnlyRootFilesystem): where the compilers that run at first use keep what they build (Triton's
# driver and launchers and its kernels, inductor's, CUDA's JIT of PTX, torch's NVRTC kernels). A
# scratch mount of its own (the unit's --tmpfs, the pod's emptyDir) of JIT_CACHE_MIB, never noexec:
# Triton and inductor load the shared objects they put there.
JIT_CACHE_DIR = f"{CACHE_MOUNT}/jit"
JIT_CACHE_MIB = 2048
# What points each of them there (their defaults are under the read-only home, or /tmp, which the
# unit's docker mounts noexec): the unit's --env and the pod's env, both rendered from this.
JIT_CACHE_ENV = (
    ("TRITON_CACHE_DIR", f"{JIT_CACHE_DIR}/triton"),
    ("TORCHINDUCTOR_CACHE_DIR", f"{JIT_CACHE_DIR}/inductor"),
    ("CUDA_CACHE_PATH", f"{JIT_CACHE_DIR}/cuda"),
    ("PYTORCH_KERNEL_CACHE_PATH", f"{JIT_CACHE_DIR}/torch-kernels"),
)
# The block device name the launch template gives the model-cache volume (it shows up as an NVMe
# device on Nitro instances; cloud-init finds it by size and EBS model, not by this name).
CACHE_DEVICE_NAME = "/dev/sdf"
UNIT_NAME = "frontier-runtime.service"
CONTAINER_NAME = "frontier-runtime"
# Under the host root: releases/<id>/, and the symlinks swapped atomically between them.
RELEASES_DIR = "releases"
CURRENT_LINK = "current"
PREVIOUS_LINK = "previous"
RELEASE_MANIFEST = "release.json"
# Under a stack's history prefix: the release a deploy is rolling out, with its expiry. A host that
# boots while it is there installs that release, not the last good one.
DEPLOYING_POINTER = "releases/deploying.json"

# --- host tools: what lands in <root>/bin (the agent, its configuration, the bootstrap) -------------
AGENT_FILE_NAME = "frontier-agent.py"
AGENT_CONFIG_NAME = "frontier-agent.json"
BOOTSTRAP_FILE_NAME = "frontier-bootstrap.py"
# On systemd hosts the agent's supervisor runs as this unit (a liveness watchdog of the runtime's).
WATCHDOG_UNIT = "frontier-agent"
SUPERVISE_COMMAND = "supervise"
SUPERVISOR_PID_NAME = "supervisor.pid"
# The supervisor's state beside it: its restarts of the runtime (``restarts``) and the last one's why.
SUPERVISOR_STATE_NAME = "supervisor.json"
# In the host root's run/: the runtime's pid, written at each launch (its mtime: when it was launched).
RUNTIME_PID_NAME = "runtime.pid"
# A first boot before the runtime starts: drivers checked, cache formatted, image pulled. The launch
# hook waits this plus rollout.readiness_timeout_s; the runtime-down alarm excepts a host as long.
HOST_BOOT_ALLOWANCE_S = 900
# The host name and address the uploaded agent configuration carries until a host fills in its own.
PLACEHOLDER_HOST = "bootstrap"
PLACEHOLDER_ADDRESS = "0.0.0.0"

# --- the balancer ------------------------------------------------------------------------------------
# HAProxy's admin socket, relative to its state folder (/run on a host, the state dir locally).
HAPROXY_ADMIN_SOCKET = "haproxy/admin.sock"
CLOUD_HAPROXY_STATE = "/run/haproxy"

# --- releases ------------------------------------------------------------------------------------------
DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
RELEASE_ID_PATTERN = re.compile(r"^r-[0-9a-f]{12}$")

# --- HTTP paths: the runtime and the gateway serve them; balancers, probes and clients call them -----
# The OpenAI-compatible API: all a load balancer forwards (the EC2 listener and the EKS Ingress);
# metrics and health answer only inside the network.
API_PATH_PREFIX = "/v1/"
COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
# The gateway's health paths, and the runtime's by default (runtime.yaml's health.readiness_path
# and health.liveness_path may move the runtime's).
READINESS_PATH = "/health/ready"
LIVENESS_PATH = "/health/live"

# --- a replica over several nodes ------------------------------------------------------------------
# Node 0 (the leader) runs ``serve``: the API, the scheduler and rank 0. Every other node runs
# ``python -m frontier_runtime node``, whose ranks connect to the leader's step port, then join the
# process group through the store port. gloo/NCCL then open ephemeral ports between every pair of
# ranks: the nodes of one replica must admit all TCP from each other (and nobody else).
NODE_COMMAND = "node"
REPLICA_STEP_PORT = 29500
REPLICA_STORE_PORT = 29501
NODE_RANK_ENV = "FRONTIER_NODE_RANK"  # 0 on the leader
LEADER_ADDRESS_ENV = "FRONTIER_LEADER_ADDRESS"  # the leader's address as the other nodes reach it
REPLICA_KEY_ENV = "FRONTIER_REPLICA_KEY"  # the step channel's HMAC key, the same on every node
# Where the nodes of a replica meet (EC2): under the history prefix, one record per slot,
# ``replicas/<node group>/<replica>/node-<k>.json``, claimed with conditional writes at boot.
REPLICAS_PREFIX = "replicas/"
SERVE_COMMAND = "serve"  # what the leader runs; the other nodes run NODE_COMMAND
RUNTIME_COMMAND_ENV = "FRONTIER_RUNTIME_COMMAND"  # serve or node: the runtime unit runs it
REPLICA_INDEX_ENV = "FRONTIER_REPLICA"  # which replica of its node group the host serves in
NODES_PER_REPLICA_ENV = "FRONTIER_NODES_PER_REPLICA"  # node.env of a group whose replica spans nodes
# The slot's facts for the runtime unit, key included: under /run (tmpfs), so never on a disk.
REPLICA_ENV_FILE = "/run/frontier/replica.env"
# A worker node's runtime port answers as its leader (a proxy): the leader's address only, no key.
LEADER_ENV_FILE = "/run/frontier/leader.env"
LEADER_PROXY_UNIT = "frontier-leader-proxy"
REPLICA_PORT_ENV = "FRONTIER_REPLICA_PORT"  # moves both ports (step, step + 1): several replicas per host
REPLICA_JOIN_TIMEOUT_ENV = "FRONTIER_REPLICA_JOIN_TIMEOUT_S"  # how long the nodes wait for each other
EXIT_NODE_LOST = 3  # the leader's serve: a node of its replica was lost (its supervisor restarts it)

# --- KV-cache events (runtime.kv_events) ----------------------------------------------------------------
# With kv_events.enabled, each runtime publishes its prefix cache's changes in vLLM's KV-event wire format
# (ZMQ PUB: topic, 8-byte big-endian sequence, msgpack batch) and answers replays from a sequence on a
# ROUTER socket; the gateway subscribes to both. vLLM's own defaults, so a vLLM pool needs no other ports.
KV_EVENTS_PORT = 5557
KV_EVENTS_REPLAY_PORT = 5558
KV_EVENTS_TOPIC = "kv-events"

# --- request priority ------------------------------------------------------------------------------
# The classes a request may carry in its ``priority`` body field (the gateway sets it from the
# tenant's class): batch runs only on capacity interactive work leaves free and is preempted first.
PRIORITY_FIELD = "priority"
INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITY_CLASSES = (INTERACTIVE, BATCH)

# --- the runtime's metrics ---------------------------------------------------------------------------
# Prometheus family names: the exposition adds ``_total`` to counters and ``_bucket``, ``_sum``,
# ``_count`` to histograms. The ``vllm:`` names match vLLM's, so dashboards built for vLLM work
# unchanged. The rollout gate, the alert rules and the autoscalers match on these strings.
MODEL_LABEL = "model_name"
ROUTE_LABEL = "route"  # an app route, or OTHER_ROUTE for any path the app does not serve
STATUS_LABEL = "status"  # the HTTP status as text; "499" when the client left before an answer
REASON_LABEL = "reason"
FINISHED_REASON_LABEL = "finished_reason"
OTHER_ROUTE = "other"

# HTTP traffic: the rollout gate's error rate and p99.
HTTP_REQUESTS_METRIC = "frontier_http_requests"  # counter {route, status}
HTTP_DURATION_METRIC = "frontier_http_request_duration_seconds"  # histogram {route}
REQUEST_FAILURES_METRIC = "frontier_request_failures"  # counter {reason}
# Constrained outputs checked against their constraint (finished with "stop"): the denominator of the
# structured-output failure rate, whose numerator is REQUEST_FAILURES_METRIC{reason=STRUCTURED_OUTPUT_INVALID}.
STRUCTURED_OUTPUTS_METRIC = "frontier_structured_outputs_checked"  # counter (_total)
STRUCTURED_OUTPUT_INVALID = "structured_output_invalid"

# Requests (histograms and counters by model_name).
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

# Engine and server state, read at scrape time (by model_name).
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
# Prefill/decode disaggregation (runtime.kv_transfer): the blocks a decode replica pulled and its
# pulls that failed; the leases a prefill replica holds and those that expired unclaimed.
KV_TRANSFER_BLOCKS_PULLED_METRIC = "frontier_kv_transfer_blocks_pulled"  # counter (_total)
KV_TRANSFER_PULL_FAILURES_METRIC = "frontier_kv_transfer_pull_failures"  # counter (_total)
KV_TRANSFER_LEASES_METRIC = "frontier_kv_transfer_leases"  # gauge
KV_TRANSFER_LEASES_EXPIRED_METRIC = "frontier_kv_transfer_leases_expired"  # counter (_total)
ADMITTED_METRIC = "frontier_admitted_requests"
QUEUED_METRIC = "frontier_queued_requests"
READY_METRIC = "frontier_ready"
DRAINING_METRIC = "frontier_draining"
# Always 1; its labels say what the engine runs on (``attention_backend``: cpu-kernel, flash-varlen,
# sdpa-gather; ``kernels``: native, native+panel-gemm or torch).
ENGINE_INFO_METRIC = "frontier_engine_info"
ATTENTION_BACKEND_LABEL = "attention_backend"
KERNELS_LABEL = "kernels"
# A replica over several ranks: the all-reduce bus bandwidth its ranks measured at start (GB/s).
INTERCONNECT_BUS_METRIC = "frontier_interconnect_bus_gbps"

# The API key set a runtime (or gateway) holds, reloaded from Secrets Manager on a schedule and on
# SIGHUP. The fingerprint is a hash of the keys' SHA-256 digests, so ``fab keys.rotate`` can tell
# which set each replica serves without any key (or a digest of one) leaving the process.
API_KEYS_LOADED_METRIC = "frontier_api_keys_loaded"  # gauge: keys in the set in use
API_KEYS_AGE_METRIC = "frontier_api_keys_age_seconds"  # gauge: since the last successful load
API_KEYS_RELOAD_FAILURES_METRIC = "frontier_api_keys_reload_failures"  # counter (_total)
API_KEYS_INFO_METRIC = "frontier_api_keys_info"  # gauge, always 1 {fingerprint}
KEYS_FINGERPRINT_LABEL = "fingerprint"

# Seconds one start of the runtime spent in each phase (fetch, verify, load, warmup, ready).
START_PHASE_METRIC = "frontier_start_phase_seconds"  # gauge {phase}
START_PHASE_LABEL = "phase"

# The process's own figures (prometheus_client's process collector): what a soak judges for leaks
# and restarts, and the local stack's resource metrics.
PROCESS_RSS_METRIC = "process_resident_memory_bytes"
PROCESS_START_METRIC = "process_start_time_seconds"
# CPU seconds the process has used (a counter, exported as ``_total``): a load test's CPU use.
PROCESS_CPU_METRIC = "process_cpu_seconds"
PROCESS_METRIC_NAMES = (
    "process_virtual_memory_bytes",
    PROCESS_RSS_METRIC,
    PROCESS_START_METRIC,
    PROCESS_CPU_METRIC,
    "process_open_fds",
    "process_max_fds",
)

# The accelerators the runtime's process sees (0 on a CPU host), and, where NVML answers on a GPU
# host, each one's utilisation and memory in use: what a load test reports as the replicas' GPU use.
GPUS_METRIC = "frontier_gpus"  # gauge
GPU_UTILIZATION_METRIC = "frontier_gpu_utilization_percent"  # gauge {device}
GPU_MEMORY_USED_METRIC = "frontier_gpu_memory_used_bytes"  # gauge {device}
DEVICE_LABEL = "device"
#: Exported only where there is a GPU to describe: a CPU host has no such series, never a 0.
GPU_METRIC_NAMES = (GPU_UTILIZATION_METRIC, GPU_MEMORY_USED_METRIC)

# Every family the runtime exports on every host, each once (GPU_METRIC_NAMES come on GPU hosts).
RUNTIME_METRIC_NAMES = (
    HTTP_REQUESTS_METRIC,
    HTTP_DURATION_METRIC,
    REQUEST_FAILURES_METRIC,
    STRUCTURED_OUTPUTS_METRIC,
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
    KV_TRANSFER_BLOCKS_PULLED_METRIC,
    KV_TRANSFER_PULL_FAILURES_METRIC,
    KV_TRANSFER_LEASES_METRIC,
    KV_TRANSFER_LEASES_EXPIRED_METRIC,
    ADMITTED_METRIC,
    QUEUED_METRIC,
    READY_METRIC,
    DRAINING_METRIC,
    ENGINE_INFO_METRIC,
    INTERCONNECT_BUS_METRIC,
    API_KEYS_LOADED_METRIC,
    API_KEYS_AGE_METRIC,
    API_KEYS_RELOAD_FAILURES_METRIC,
    API_KEYS_INFO_METRIC,
    START_PHASE_METRIC,
    GPUS_METRIC,
    *PROCESS_METRIC_NAMES,
)

# --- the gateway: headers it reads and sets, its metrics ---------------------------------------------
SESSION_HEADER = "x-session-id"  # the default affinity header
REQUEST_ID_HEADER = "x-request-id"  # the gateway's own id of a request (metering, upstream, answer)
CLIENT_REQUEST_ID_HEADER = "x-client-request-id"  # a client's own id, echoed and metered beside ours
REPLICA_HEADER = "x-frontier-replica"  # which replica answered, as an opaque id (clients debugging affinity)
# Sent by the gateway to a runtime: "1" asks for each streamed chunk's token ids (choices[0].token_ids),
# what a migration of the stream to another replica continues from.
TOKEN_IDS_HEADER = "x-frontier-token-ids"
# The request body's extension field that continues a generation another replica began.
CONTINUATION_FIELD = "frontier_continuation"
# The gateway's admin path that moves every generation a replica serves to others (a spot or
# capacity notice): POST {"replica": "<base URL>"}.
GATEWAY_INTERRUPT_PATH = "/admin/replicas/interrupt"
# OpenAI's rate-limit headers, on every answer to an authenticated request.
LIMIT_REQUESTS = "x-ratelimit-limit-requests"
LIMIT_TOKENS = "x-ratelimit-limit-tokens"
REMAINING_REQUESTS = "x-ratelimit-remaining-requests"
REMAINING_TOKENS = "x-ratelimit-remaining-tokens"
RESET_REQUESTS = "x-ratelimit-reset-requests"
RESET_TOKENS = "x-ratelimit-reset-tokens"

# Prometheus family names (counters get _total); the gateway labels by ``model``, not ``model_name``.
TENANT_LABEL = "tenant"
GATEWAY_MODEL_LABEL = "model"
GATEWAY_REQUESTS_METRIC = "frontier_gateway_requests"  # counter {tenant, model, status}
GATEWAY_DURATION_METRIC = "frontier_gateway_request_duration_seconds"  # histogram {tenant, model}
GATEWAY_TTFT_METRIC = "frontier_gateway_time_to_first_token_seconds"  # histogram {tenant, model}
GATEWAY_TOKENS_METRIC = "frontier_gateway_tokens"  # counter {tenant, model, kind=prompt|completion}
GATEWAY_RATE_LIMITED_METRIC = "frontier_gateway_rate_limited"  # counter {tenant, limit}
GATEWAY_KV_ROUTING_METRIC = "frontier_gateway_kv_routing"  # counter {model, outcome}: KV routing decisions
GATEWAY_KV_BLOCKS_METRIC = "frontier_gateway_kv_index_blocks"  # gauge {model, replica}: blocks indexed
GATEWAY_IN_FLIGHT_METRIC = "frontier_gateway_in_flight"  # gauge {tenant}
GATEWAY_RETRIES_METRIC = "frontier_gateway_retries"  # counter {model}
GATEWAY_MIGRATIONS_METRIC = "frontier_gateway_migrations"  # counter {model, reason}: generations moved
GATEWAY_MIGRATION_STALL_METRIC = "frontier_gateway_migration_stall_seconds"  # histogram {model}
GATEWAY_MIGRATION_FAILURES_METRIC = "frontier_gateway_migration_failures"  # counter {model, why}
GATEWAY_REPLICA_READY_METRIC = "frontier_gateway_replica_ready"  # gauge {model, replica}
GATEWAY_REPLICA_OUTSTANDING_METRIC = "frontier_gateway_replica_outstanding"  # gauge {model, replica}
GATEWAY_REPLICA_BREAKER_METRIC = "frontier_gateway_replica_breaker_open"  # gauge {model, replica}
GATEWAY_KEYS_LOADED_METRIC = "frontier_gateway_keys_loaded"  # gauge: tenant key digests in use
GATEWAY_KEYS_AGE_METRIC = "frontier_gateway_keys_age_seconds"  # gauge: since the last successful load
GATEWAY_KEYS_RELOAD_FAILURES_METRIC = "frontier_gateway_keys_reload_failures"  # counter (_total)

# --- CloudWatch: what each host's bootstrap publishes and the alarms and scaling policies read ------
CLOUDWATCH_NAMESPACE = "Frontier/Runtime"
QUEUE_DEPTH_METRIC = "QueueDepth"
RUNNING_REQUESTS_METRIC = "RunningRequests"
# Milliseconds, published as values with counts from the runtime's histogram, so CloudWatch
# computes true percentiles of whole requests (the ALB's TargetResponseTime is time to first byte).
E2E_LATENCY_CW_METRIC = "EndToEndLatency"
RESTARTS_CW_METRIC = "RuntimeRestarts"
# The series the named alarms (frontier/alarms.py) read on EC2: time to first token in milliseconds
# (values with counts, as EndToEndLatency), the fullest KV cache (a fraction), constrained outputs
# checked and those that failed their constraint since the last publish, and whether the runtime is
# up (1: ready, draining, or starting — within rollout.readiness_timeout_s of its launch, or of the
# host's boot before any launch) or down (0: not ready past its start, or not answering its /metrics).
TTFT_CW_METRIC = "TimeToFirstToken"
KV_USAGE_CW_METRIC = "KVCacheUsage"
STRUCTURED_OUTPUTS_CW_METRIC = "StructuredOutputs"
STRUCTURED_FAILURES_CW_METRIC = "StructuredOutputFailures"
RUNTIME_UP_CW_METRIC = "RuntimeUp"
# Seconds one start of the runtime spent in each phase (START_PHASE_METRIC's: fetch, verify, load,
# warmup, and ready, the whole start), under the group's dimensions plus Phase, once per start: what
# a group's instance warm-up (NodeGroup.instance_warmup_s) is set from, beside the host's boot.
STARTUP_CW_METRIC = "StartupSeconds"
STARTUP_PHASE_DIMENSION = "Phase"
# The synthetic probe's (frontier_hostside/probe.py) outcome each minute, under the dimension Stack
# only: 1 or 0, and the whole request's latency in milliseconds.
PROBE_SUCCESS_CW_METRIC = "ProbeSuccess"
PROBE_LATENCY_CW_METRIC = "ProbeLatency"
# The tenant a gateway knows the probe by: the runtimes' own keys, which the probe presents, with a
# quota of a few requests a minute per model (frontier_gateway/tenants.py). No stack's tenant takes it.
PROBE_TENANT = "frontier-probe"
# Every host of a node group publishes under the same dimensions: the group's Average is the
# per-host figure the scaling policy tracks.
CLOUDWATCH_DIMENSIONS = ("Stack", "NodeGroup")
# An EC2 gateway host publishes (the bootstrap's ``publish-gateway``) each pool's held requests
# under the pool's node group (what its from-zero alarm reads), and the requests it answered and
# those it answered with a 5xx, since the last publish, under this NodeGroup value.
GATEWAY_NODE_GROUP = "gateway"
GATEWAY_REQUESTS_CW_METRIC = "GatewayRequests"
GATEWAY_5XX_CW_METRIC = "Gateway5xx"

# --- auto scaling lifecycle hooks: infra/ creates them, the host bootstrap completes them ----------
LAUNCH_HOOK = "frontier-launch"
TERMINATE_HOOK = "frontier-terminate"
# Under the history prefix: what hosts bootstrap with (Pulumi uploads it), and their boot records.
HOST_TOOLS_PREFIX = "host/"
BOOT_RECORDS_PREFIX = "boots/"

# --- the local stack's stand-in for AWS ------------------------------------------------------------
# moto accepts any credentials; these mark requests as the local stack's own.
LOCAL_AWS_KEY_ID = "frontier-local"
LOCAL_AWS_SECRET = "frontier-local"

# --- Kubernetes: the renderer writes these, the backend patches them, the policy pack checks them --
K8S_APP_LABEL = "app.kubernetes.io/name"
K8S_INSTANCE_LABEL = "app.kubernetes.io/instance"
K8S_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# stable | canary: the canary Deployment's pods share the Service but not the stable selector.
K8S_TRACK_LABEL = "frontier.dev/track"
# On the pod template: a change of runtime.yaml changes the template, so the Deployment rolls.
K8S_CONFIG_HASH_ANNOTATION = "frontier.dev/config-hash"
K8S_RELEASE_ANNOTATION = "frontier.dev/release"
# A canary pod's readiness gate under rollout.verify_canary: the pod stays out of its Service's
# endpoints (no traffic) until the rollout, having verified it, sets this condition True.
K8S_VERIFIED_CONDITION = "frontier.dev/verified"
GPU_RESOURCE = "nvidia.com/gpu"
# The EC2 instance metadata service: no pod of ours may reach it (credentials come from Pod
# Identity or IRSA, never the node's role).
INSTANCE_METADATA_CIDR = "169.254.169.254/32"
