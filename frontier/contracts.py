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

# --- metrics and paths: the runtime defines them (it exports them); the gate, alerts and ----------
# autoscaling read them. Re-exported here so the toolkit has one place to import shared names from.
from frontier_runtime.contracts import (  # noqa: E402,F401
    DEFAULT_LIVENESS_PATH,
    DEFAULT_READINESS_PATH,
    E2E_LATENCY_METRIC,
    HTTP_DURATION_METRIC,
    HTTP_REQUESTS_METRIC,
    KV_USAGE_METRIC,
    METRIC_NAMES,
    METRICS_PATH,
    PREFIX_CACHE_HITS_METRIC,
    PREFIX_CACHE_QUERIES_METRIC,
    PRIORITY_CLASSES,
    READY_METRIC,
    RUNNING_METRIC,
    TTFT_METRIC,
    WAITING_METRIC,
)

# CloudWatch: what each host publishes and the alarms and scaling policies read.
CLOUDWATCH_NAMESPACE = "Frontier/Runtime"
QUEUE_DEPTH_METRIC = "QueueDepth"
RUNNING_REQUESTS_METRIC = "RunningRequests"
# Milliseconds, published as values with counts from the runtime's histogram, so CloudWatch
# computes true percentiles of whole requests (the ALB's TargetResponseTime is time to first byte).
E2E_LATENCY_CW_METRIC = "EndToEndLatency"
RESTARTS_CW_METRIC = "RuntimeRestarts"
# Every host of a node group publishes under the same dimensions: the group's Average is the
# per-host figure the scaling policy tracks.
CLOUDWATCH_DIMENSIONS = ("Stack", "NodeGroup")

# --- auto scaling lifecycle hooks: infra/ creates them, the host bootstrap completes them ----------
LAUNCH_HOOK = "frontier-launch"
TERMINATE_HOOK = "frontier-terminate"
# Under the history prefix: what Pulumi uploads for hosts to bootstrap with, and their boot records.
HOST_TOOLS_PREFIX = "host/"
BOOT_RECORDS_PREFIX = "boots/"

# --- the local stack's stand-in for AWS ------------------------------------------------------
# moto accepts any credentials; these mark requests as the local stack's own.
LOCAL_AWS_KEY_ID = "frontier-local"
LOCAL_AWS_SECRET = "frontier-local"

# --- Kubernetes: the renderer writes these, the backend patches them, the policy pack checks them
K8S_APP_LABEL = "app.kubernetes.io/name"
K8S_INSTANCE_LABEL = "app.kubernetes.io/instance"
K8S_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# stable | canary: the canary Deployment's pods share the Service but not the stable selector.
K8S_TRACK_LABEL = "frontier.dev/track"
# On the pod template: a change of runtime.yaml changes the template, so the Deployment rolls.
K8S_CONFIG_HASH_ANNOTATION = "frontier.dev/config-hash"
K8S_RELEASE_ANNOTATION = "frontier.dev/release"
GPU_RESOURCE = "nvidia.com/gpu"
# The EC2 instance metadata service: no pod of ours may reach it (credentials come from Pod
# Identity or IRSA, never the node's role).
INSTANCE_METADATA_CIDR = "169.254.169.254/32"
