"""Names that several rooms must agree on, each defined once.

The Pulumi program tags hosts that ``fab`` discovers and the policy pack checks; the toolkit
renders paths that the host agent and the systemd unit use; the rollout gate, the alert rules and
the CloudWatch alarms read metrics the runtime exports. A name that lives here is imported by all
of them; none of them spells it again.
"""

from __future__ import annotations

import re

# --- tags: infra/ writes them, fleet/inventory reads them, policy/ requires them ---------------
TAG_PREFIX = "frontier:"
STACK_TAG = "frontier:stack"
NODE_GROUP_TAG = "frontier:node-group"
ROLE_TAG = "frontier:role"
PURPOSE_TAG = "frontier:purpose"
MANAGED_BY_TAG = "frontier:managed-by"
RUNTIME_ROLE = "runtime"
DISCOVERY_TAGS = (STACK_TAG, NODE_GROUP_TAG, ROLE_TAG)

# --- host layout: render/ writes it, fleet/ and the host agent use it -------------------------
HOST_ROOT = "/opt/frontier"
CACHE_MOUNT = "/var/cache/frontier"
CLOUD_WEIGHTS_CACHE = f"{CACHE_MOUNT}/weights"
CONTAINER_RELEASE_DIR = "/etc/frontier/release"
# The block device name the launch template gives the model-cache volume (it shows up as an NVMe
# device on Nitro instances; cloud-init finds it by size and EBS model, not by this name).
CACHE_DEVICE_NAME = "/dev/sdf"
UNIT_NAME = "frontier-runtime.service"
CONTAINER_NAME = "frontier-runtime"
RELEASES_DIR = "releases"
CURRENT_LINK = "current"
RELEASE_MANIFEST = "release.json"

# --- the balancer ------------------------------------------------------------------------------
# HAProxy's admin socket, relative to its state folder (/run on a host, the state dir locally).
HAPROXY_ADMIN_SOCKET = "haproxy/admin.sock"
CLOUD_HAPROXY_STATE = "/run/haproxy"

# --- releases ------------------------------------------------------------------------------------
DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
RELEASE_ID_PATTERN = re.compile(r"^r-[0-9a-f]{12}$")

# --- metrics: the runtime exports them; the gate, alerts and autoscaling read them -------------
HTTP_REQUESTS_METRIC = "frontier_http_requests"  # a counter: the exposition adds _total
HTTP_DURATION_METRIC = "frontier_http_request_duration_seconds"
READY_METRIC = "frontier_ready"
TTFT_METRIC = "vllm:time_to_first_token_seconds"
E2E_LATENCY_METRIC = "vllm:e2e_request_latency_seconds"
WAITING_METRIC = "vllm:num_requests_waiting"
RUNNING_METRIC = "vllm:num_requests_running"
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"

# CloudWatch: what each host publishes and the alarms and scaling policies read.
CLOUDWATCH_NAMESPACE = "Frontier/Runtime"
QUEUE_DEPTH_METRIC = "QueueDepth"

# --- the local stack's stand-in for AWS ------------------------------------------------------
# moto accepts any credentials; these mark requests as the local stack's own.
LOCAL_AWS_KEY_ID = "frontier-local"
LOCAL_AWS_SECRET = "frontier-local"
