"""Typed settings of one stack: every field of ``stacks/Pulumi.<stack>.yaml``, with its allowed range.

The stack file is the one source of truth for an environment. Pulumi reads it as project config
(``frontier:<key>``); everything else in Frontier reads it through :func:`frontier.config.load.load_stack`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from frontier_gateway.config import GatewaySettings, TenantConfig
from frontier_hostside.names import HOST_ROOT, RUNTIME_UID
from frontier_runtime.config import HealthConfig, KvRole, ModelConfig, RuntimeConfig, RuntimeSettings
from frontier_settings import FieldProblem, FieldProblems
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from frontier.config.purchase import GroupCapacity, block_problems, check_spot, falls_back_to
from frontier.config.schedule import Schedule
from frontier.errors import StackError

PROJECT = "frontier"

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
GIB = 1024**3
GB = 10**9
MIB = 1024**2
# gp3 throughput: the baseline every volume gets, and the most one can be provisioned with.
GP3_BASELINE_MIBPS = 125
GP3_MAX_MIBPS = 1000
S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Network(_Settings):
    availability_zones: int = Field(ge=2, le=6)
    vpc_cidr: str
    nat: Literal["single", "per_az"]
    # What runtime hosts may reach: "endpoints" — HTTPS to the VPC (its interface endpoints) and to
    # S3 through the gateway endpoint, nothing else, so the AMI must carry every package the host
    # needs (the Deep Learning AMI has the driver, the container toolkit and docker); "internet" —
    # HTTPS/HTTP anywhere through the NAT, for an AMI that installs them at boot.
    egress: Literal["endpoints", "internet"] = "endpoints"

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        net = ipaddress.ip_network(value, strict=True)
        if not 16 <= net.prefixlen <= 24:
            raise ValueError(f"prefix length must be between /16 and /24, got /{net.prefixlen}")
        return value


class NodeGroup(_Settings):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    instance_type: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    accelerator: Literal["gpu", "cpu"] = "gpu"
    gpus_per_node: int = Field(ge=1, le=16)
    gpu_memory_gb: float = Field(gt=0, le=1024, description="Memory of one GPU (decimal GB).")
    nvlink_domain_gpus: int = Field(ge=1, le=576, description="GPUs joined by NVLink (one node or a rack).")
    min_size: int = Field(ge=0, le=1000)
    desired_size: int = Field(ge=0, le=1000)
    max_size: int = Field(ge=1, le=1000)
    price_per_hour: float = Field(ge=0, le=10_000)
    root_volume_gb: int = Field(default=100, ge=20, le=16_384)
    cache_volume_gb: int = Field(default=200, ge=1, le=65_536)
    efa: bool = False
    # The AMI every host of the group boots, pinned: a change is an instance refresh, never drift.
    # `fab ami.latest -s <stack>` proposes the newest one. Empty only where no EC2 group is built.
    ami_id: str = Field(default="", pattern=r"^(ami-([0-9a-f]{8}|[0-9a-f]{17}))?$")
    # Requests waiting per host that the target-tracking policy holds the group at (between
    # min_size and max_size), read from the QueueDepth metric each host publishes.
    target_queue_depth: float = Field(default=16, gt=0, le=100_000)
    # Scale in (a replica at a time) only when nothing waits and the replicas left would run at most
    # this fraction of their concurrency: an empty queue alone is the normal state of a steady load.
    scale_in_utilisation: float = Field(default=0.5, gt=0, le=1)
    # With min_size 0: after this long with nothing running, waiting or held by the gateway, the
    # group goes to zero hosts; a request for it is then held by the gateway (gateway.hold) while one
    # starts. Unset: the group never scales to zero.
    idle_to_zero_s: float | None = Field(default=None, ge=1, le=86_400)
    # Where the model cache lives: the instance's own NVMe disks (RAID 0, formatted at boot; the
    # type must have them) or an EBS gp3 volume of cache_volume_gb.
    model_cache: Literal["instance_store", "ebs"] = "ebs"
    # A higher floor by time of day, and one forecast from the load a period ago
    # (frontier/config/schedule.py): capacity in place before a known peak.
    schedule: Schedule | None = None
    # How the hosts are bought: unset on-demand; spot above an on-demand base, or a Capacity Block
    # (frontier/config/purchase.py).
    capacity: GroupCapacity | None = None
    # Seconds from a host's launch to its runtime serving: the scaling policies' instance warm-up,
    # during which a new host's metrics do not count yet. Unset: estimated from the weights of the
    # pools on the group (frontier/capacity/startup.py); set it from the StartupSeconds hosts publish.
    instance_warmup_s: int | None = Field(default=None, ge=0, le=3600)

    @model_validator(mode="after")
    def _capacity_fits_the_group(self) -> NodeGroup:
        check_spot(self.instance_type, self.max_size, self.capacity)
        return self

    @model_validator(mode="after")
    def _schedule_within_the_group(self) -> NodeGroup:
        if self.schedule is None or self.min_size > self.max_size:
            return self  # min_size above max_size: the stack check names that first
        problems = [
            FieldProblem(
                f"schedule.windows[{i}].min_size",
                w.min_size,
                f"must lie between the group's {{min_size}} ({self.min_size}) and {{max_size}} ({self.max_size})",
            )
            for i, w in enumerate(self.schedule.windows)
            if not self.min_size <= w.min_size <= self.max_size
        ]
        if problems:
            raise FieldProblems(*problems)
        return self


class Model(ModelConfig):
    """The stack's ``model:`` section: the runtime's model settings, and the shape the planner needs."""

    num_layers: int = Field(ge=1, le=512)
    hidden_size: int = Field(ge=16, le=65_536)
    intermediate_size: int = Field(ge=16, le=262_144)
    num_attention_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    vocab_size: int = Field(ge=16, le=1_048_576)
    tie_word_embeddings: bool = False
    num_experts: int = Field(default=0, ge=0, le=1024, description="0 for a dense model.")
    num_experts_per_token: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Experts the router sends each token to (top-k); 0 for a dense model.",
    )
    moe_intermediate_size: int = Field(
        default=0, ge=0, le=262_144, description="One expert's MLP width; 0: intermediate_size."
    )
    # Routers never spread tokens perfectly: the busiest expert-parallel rank sets the step's pace.
    # 1.2 is a planning default (the busiest rank ~20 % above the mean); measured routers replace it.
    expert_load_imbalance: float = Field(
        default=1.2, ge=1, le=16, description="Busiest expert-parallel rank's load over the mean."
    )

    @model_validator(mode="after")
    def _heads_split_evenly(self) -> Model:
        problems = []
        if self.hidden_size % self.num_attention_heads:
            problems.append(
                FieldProblem(
                    "hidden_size",
                    self.hidden_size,
                    f"must be divisible by {{num_attention_heads}} ({self.num_attention_heads})",
                )
            )
        if self.num_attention_heads % self.num_kv_heads:
            problems.append(
                FieldProblem(
                    "num_kv_heads",
                    self.num_kv_heads,
                    f"must divide {{num_attention_heads}} ({self.num_attention_heads})",
                )
            )
        if self.num_experts_per_token > self.num_experts:
            problems.append(
                FieldProblem(
                    "num_experts_per_token",
                    self.num_experts_per_token,
                    f"must be <= {{num_experts}} ({self.num_experts}): each token goes to top-k of the experts",
                )
            )
        if problems:
            raise FieldProblems(*problems)
        return self

    @field_validator("version")
    @classmethod
    def _versioned(cls, value: str) -> str:
        # Hosts cache weights by version: an unversioned model could never be replaced in place.
        if not value:
            raise ValueError("required: the weights version (part of every host's cache key)")
        return value

    @field_validator("weights_uri")
    @classmethod
    def _in_s3(cls, value: str) -> str:
        # A stack's hosts fetch weights from its bucket; a local directory is for a runtime run by hand.
        if not S3_URI.match(value):
            raise ValueError("must be an s3://bucket/prefix URI (fab weights.push uploads it)")
        return value

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def expert_intermediate_size(self) -> int:
        """One MLP's width: an expert's where the model has its own for them, else the dense one."""
        return (
            self.moe_intermediate_size
            if self.num_experts and self.moe_intermediate_size
            else self.intermediate_size
        )

    @property
    def num_parameters(self) -> int:
        """Parameters of a Llama-family decoder, from its shape."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = h * h + 2 * h * kv + h * h
        experts = max(1, self.num_experts)
        width = self.expert_intermediate_size
        mlp = 3 * h * width * experts + (h * self.num_experts if self.num_experts else 0)
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h


class Runtime(RuntimeSettings):
    """The stack's ``runtime:`` section: the runtime's own settings, plus how the toolkit ships it."""

    image_repository: str = Field(
        default="frontier-runtime",
        pattern=r"^[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._/-]*)?$",
        description="Container repository of the runtime image (ECR URI); deployed by digest only.",
    )
    reserved_memory_gb: float = Field(
        default=1.0, ge=0, le=256, description="Activations, graphs, workspace (the planner's memory fit)."
    )

    @field_validator("api_keys_secret")
    @classmethod
    def _authenticated(cls, value: str | None) -> str | None:
        # A runtime a stack deploys is reached over the network: it always checks keys.
        if not value:
            raise ValueError("required: the Secrets Manager id of the runtime's API keys")
        return value


class Health(HealthConfig):
    """The stack's ``health:`` section: the runtime's probe paths, and how the balancer probes them."""

    interval_s: int = Field(ge=1, le=300)
    timeout_s: int = Field(ge=1, le=120)
    healthy_threshold: int = Field(ge=1, le=10)
    unhealthy_threshold: int = Field(ge=1, le=10)


class Gate(_Settings):
    window_s: float = Field(ge=0, le=3600)
    max_error_rate: float = Field(ge=0, le=1)
    max_p99_latency_ms: float = Field(gt=0, le=3_600_000)
    min_requests: int = Field(ge=0, le=1_000_000)
    max_p99_ratio: float | None = Field(
        default=None,
        gt=1,
        le=100,
        description=(
            "The canary's p99 over the window may be at most this times the p99 of a host still on the "
            "old release over the same window (none: the absolute limit only)."
        ),
    )


class Rollout(_Settings):
    canary_hosts: int = Field(ge=0, le=100)
    batch_size: int = Field(ge=1, le=100, description="Hosts out of service at once after the canary.")
    max_surge: int = Field(ge=0, le=100, description="Extra nodes added first when the group can grow.")
    deregistration_delay_s: int = Field(ge=0, le=3600)
    readiness_timeout_s: float = Field(gt=0, le=7200)
    keep_releases: int = Field(ge=2, le=50)
    keep_weight_versions: int = Field(
        default=2,
        ge=0,
        le=100,
        description=(
            "fab weights.gc keeps this many most recently pushed weights versions besides every version "
            "a kept release needs (0: only those)."
        ),
    )
    gate: Gate
    verify_canary: bool = Field(
        default=False,
        description=(
            "Run the stack's verification set (verify.file) on each canary host and on a host still on the "
            "old release before the rollout goes on; a failure rolls back, naming the failing cases."
        ),
    )
    traffic_steps: tuple[int, ...] = Field(
        default=(),
        max_length=20,
        description=(
            "A traffic-weighted rollout: the percent of the pool's traffic the new release takes at each "
            "step, on the canary hosts, each step held for rollout.gate.window_s and gated against the "
            "old release; increasing, each 1..100, the last 100 (empty: the host rollout by batch)."
        ),
    )

    @field_validator("traffic_steps")
    @classmethod
    def _steps_climb_to_all_traffic(cls, steps: tuple[int, ...]) -> tuple[int, ...]:
        if not steps:
            return steps
        outside = [step for step in steps if not 1 <= step <= 100]
        if outside:
            raise ValueError(f"{list(steps)}: every step must be a percent in 1..100, not {outside[0]}")
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"{list(steps)}: the steps must increase strictly")
        if steps[-1] != 100:
            raise ValueError(f"{list(steps)}: the last step must be 100 (all traffic on the new release)")
        return steps


class Slo(_Settings):
    ttft_ms: float = Field(gt=0, le=600_000)
    tpot_ms: float = Field(gt=0, le=60_000)
    p99_latency_ms: float = Field(gt=0, le=3_600_000)
    error_rate: float = Field(ge=0, le=1)


class Capacity(_Settings):
    peak_qps: float = Field(gt=0, le=1_000_000)
    safety_factor: float = Field(ge=1.3, le=1.5, description="Headroom over the peak (the brief: 1.3-1.5).")
    avg_prompt_tokens: int = Field(ge=1, le=1_048_576)
    avg_output_tokens: int = Field(ge=1, le=1_048_576)
    assumed_replica_qps: float = Field(gt=0, le=1_000_000, description="Used until a baseline is measured.")
    input_length_edges: tuple[int, ...] = Field(
        default=(256, 1024, 4096),
        max_length=16,
        description=(
            "Prompt lengths (tokens) where `fab loadtest` splits its requests into rows: the default "
            "gives <256, 256-1k, 1k-4k and >=4k. Empty: one row for every length."
        ),
    )

    @field_validator("input_length_edges")
    @classmethod
    def _edges_increase(cls, edges: tuple[int, ...]) -> tuple[int, ...]:
        outside = [edge for edge in edges if not 2 <= edge <= 1_048_576]
        if outside:
            raise ValueError(f"{list(edges)}: every edge must be 2..1048576 tokens, not {outside[0]}")
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"{list(edges)}: the edges must increase strictly")
        return edges


class Releases(_Settings):
    """The stack's ``releases:`` section: what a release must show before ``fab release.build`` registers it."""

    refuse_vulnerabilities_at: Literal["none", "low", "medium", "high", "critical"] = Field(
        default="none",
        description=(
            "Refuse a release whose audit (pip-audit over its lock) finds a known vulnerability at or "
            "above this severity, or whose audit could not run; a finding of unknown severity counts "
            "as at or above any. 'none' records the audit and refuses nothing."
        ),
    )


class Backup(_Settings):
    """The stack's ``backup:`` section: where a second copy of its history and metering lives.

    With ``region`` set, the stack's program replicates its history bucket (and its own metering
    bucket) to a bucket in that region, and its API-keys secret to a replica there
    (infra/backup.py); ``fab restore --from backup`` reads that copy. The policy pack refuses a
    production stack without it.
    """

    region: str = Field(
        default="",
        pattern=r"^([a-z]{2}(-[a-z]+)+-[0-9])?$",
        description="The AWS region of the backup copy; empty: no copy outside the bucket's own versions.",
    )


class Verify(_Settings):
    """The stack's ``verify:`` section: the verification set ``fab verify`` (and a canary) runs."""

    file: str = Field(
        default="stacks/verify/default.yaml",
        min_length=1,
        description="The verification set (YAML); relative to the project root.",
    )
    min_pass_rate: float = Field(default=1.0, ge=0, le=1, description="Below this, a verification fails.")
    max_pass_rate_drop: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="A canary's pass rate may be at most this far below the old release's on the same set.",
    )


class Host(_Settings):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    address: str
    ssh_port: int = Field(default=22, ge=1, le=65535)
    root: str = Field(default=HOST_ROOT, min_length=1)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        ipaddress.ip_address(value)
        return value


class Inventory(_Settings):
    source: Literal["static", "aws"]
    ssh_user: str = Field(min_length=1)
    ssh_key_file: str = ""
    ssh_gateway: str = ""
    hosts: tuple[Host, ...] = ()


def _client_cidr(value: str) -> str:
    """One IPv4 range of clients, in CIDR notation, that is narrower than everyone."""
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"not an IPv4 network in CIDR notation ({exc}); e.g. 203.0.113.0/24") from None
    if net.version != 4:
        raise ValueError("the load balancer listens on IPv4 only: give IPv4 ranges, e.g. 203.0.113.0/24")
    if net.prefixlen == 0:
        raise ValueError("admits everyone: leave allow_cidrs empty for a balancer open to all")
    return value


class Edge(_Settings):
    certificate_arn: str = ""
    # The name clients call the load balancer by: the certificate's, with a DNS record (outside this
    # stack) pointing at the load balancer. Empty: the load balancer's own DNS name, which the
    # certificate does not cover (tools then need --url or certificate checks off).
    domain: str = Field(default="", pattern=r"^(([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63})?$")
    ssl_policy: str = "ELBSecurityPolicy-TLS13-1-2-2021-06"
    idle_timeout_s: int = Field(default=300, ge=1, le=4000)
    waf_rate_limit: int = Field(default=0, ge=0, le=2_000_000_000, description="0 turns WAF off.")
    # internal: the load balancer gets private addresses only (private subnets); reachable from the
    # VPC and the networks joined to it (peering, VPN, Direct Connect, Transit Gateway).
    scheme: Literal["internet-facing", "internal"] = "internet-facing"
    # Client ranges the load balancer admits (its security group; the Ingress's inbound-cidrs).
    # Empty: anyone on an internet-facing one, the VPC's own range on an internal one. Each range
    # is two security-group rules (443 and the redirect port 80) of the 60 a group holds by default.
    allow_cidrs: tuple[Annotated[str, AfterValidator(_client_cidr)], ...] = Field(default=(), max_length=25)

    def client_cidrs(self, vpc_cidr: str) -> tuple[str, ...]:
        """The ranges the load balancer admits: the allowlist; without one, everyone on an
        internet-facing balancer (the policy pack refuses that on production stacks without a WAF),
        the VPC on an internal one (networks joined to the VPC are the operator's to list)."""
        if self.allow_cidrs:
            return self.allow_cidrs
        return ("0.0.0.0/0",) if self.scheme == "internet-facing" else (vpc_cidr,)


class Drivers(_Settings):
    driver_branch: str = Field(pattern=r"^[0-9]{3}$")
    container_toolkit_version: str = Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")


class Monitoring(_Settings):
    alarm_email: str = ""
    queue_depth_alarm: int = Field(ge=1, le=1_000_000)
    # Fraction of the KV cache in use above which an alert fires (preemptions follow soon after).
    kv_usage_alarm: float = Field(default=0.95, gt=0, le=1)


# --- alerts: who hears of which alarm --------------------------------------------------------------

Severity = Literal["page", "warn", "info"]
SEVERITIES: tuple[Severity, ...] = ("page", "warn", "info")

# Every alarm a stack raises, on every target, and the severity it has unless the stack's
# ``alerts.severities`` says otherwise. page: someone acts now (clients see it); warn: within the
# day (headroom is going); info: for the record.
ALARM_SEVERITIES: dict[str, Severity] = {
    "runtime-down": "page",  # fewer replicas ready than desired, for alerts.runtime_down_for_s
    "5xx-rate": "page",
    "p99-latency": "page",
    "ttft": "page",
    "unhealthy-hosts": "page",
    "queue-depth": "warn",
    "kv-cache-full": "warn",
    "structured-output-failures": "warn",
    "probe-failing": "page",  # the synthetic probe's fixed request through the public endpoint
    "runtime-restarts": "warn",
    "gpu-memory": "warn",
    "host-memory": "warn",
    "cache-disk": "warn",
    "gpu-temperature": "info",
    "gateway-5xx-rate": "page",
    "gateway-unhealthy-hosts": "page",
    "gateway-cpu": "warn",
}


def _shaped(pattern: str, shape: str) -> AfterValidator:
    """A string matching ``pattern``; otherwise an error saying which ``shape`` it must have."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.match(value):
            raise ValueError(f"must be {shape}")
        return value

    return AfterValidator(check)


EMAIL = _shaped(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,63}$", "an e-mail address, e.g. oncall@example.com")
SQS_ARN = _shaped(
    r"^arn:aws[a-z-]*:sqs:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:[A-Za-z0-9_-]{1,80}(\.fifo)?$",
    "an SQS queue ARN, arn:aws:sqs:<region>:<account>:<queue>",
)
HTTPS_URL = _shaped(r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/\S*)?$", "an https:// URL")


class AlertRoute(_Settings):
    """Where one severity's alarm and recovery messages go (subscriptions of its SNS topic, or an
    Alertmanager receiver). E-mail subscriptions stay pending until the recipient confirms."""

    emails: tuple[Annotated[str, EMAIL], ...] = ()
    sqs_queue_arns: tuple[Annotated[str, SQS_ARN], ...] = ()
    https_endpoints: tuple[Annotated[str, HTTPS_URL], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.emails or self.sqs_queue_arns or self.https_endpoints)


class AlertRoutes(_Settings):
    page: AlertRoute = AlertRoute()
    warn: AlertRoute = AlertRoute()
    info: AlertRoute = AlertRoute()


class Alerts(_Settings):
    """The stack's ``alerts:`` section: routes per severity, and severities per alarm name."""

    routes: AlertRoutes = AlertRoutes()
    # Alarm name -> severity, over the default table (ALARM_SEVERITIES).
    severities: dict[str, Severity] = Field(default_factory=dict)
    # The local stack's evaluator: how often it looks, and how long fewer runtimes than desired may
    # be ready before runtime-down fires (a restart by the supervisor usually beats it).
    evaluation_interval_s: float = Field(default=5, gt=0, le=300)
    runtime_down_for_s: float = Field(default=30, ge=0, le=3600)

    @field_validator("severities")
    @classmethod
    def _known_alarms(cls, value: dict[str, Severity]) -> dict[str, Severity]:
        unknown = [name for name in value if name not in ALARM_SEVERITIES]
        if unknown:
            raise FieldProblems(
                *(
                    FieldProblem(name, value[name], "no such alarm; alarms: " + ", ".join(ALARM_SEVERITIES))
                    for name in unknown
                )
            )
        return value

    def severity(self, alarm: str) -> Severity:
        """The severity of ``alarm``: the stack's choice, else the default table's."""
        if alarm not in ALARM_SEVERITIES:
            raise KeyError(f"alarm {alarm!r} is not in the table of alarms (ALARM_SEVERITIES)")
        return self.severities.get(alarm, ALARM_SEVERITIES[alarm])

    def route(self, severity: Severity, alarm_email: str = "") -> AlertRoute:
        """``severity``'s route; ``monitoring.alarm_email`` (one on-call address, the shorthand older
        stack files use) joins the page route."""
        route: AlertRoute = getattr(self.routes, severity)
        if severity == "page" and alarm_email and alarm_email not in route.emails:
            return route.model_copy(update={"emails": (*route.emails, alarm_email)})
        return route


class LocalAutoscaler(_Settings):
    """The local stack's autoscaler (``fab local.autoscale``): target tracking on the runtimes' queue
    depth, as the cloud's policy on the QueueDepth metric, with SkyServe-style up/down delays."""

    interval_s: float = Field(default=1.0, gt=0, le=60, description="Seconds between scrapes of /metrics.")
    scale_out_after_s: float = Field(
        default=10, ge=0, le=3600, description="Queue depth over target this long: launch a slot."
    )
    scale_in_after_s: float = Field(
        default=30, ge=0, le=3600, description="Nothing waiting and little running this long: retire one."
    )
    cooldown_s: float = Field(default=10, ge=0, le=3600, description="Quiet time after each change.")


class Local(_Settings):
    """The embedded local stack's own section (``frontier:local``): one machine, moto's server for
    AWS, HAProxy for the balancer, host slots over SSH on loopback aliases."""

    target: Literal["local"] = "local"
    state_dir: str = ".frontier/local"
    # The balancer and the moto server listen here only: nothing of the local stack leaves the machine.
    bind_address: str = "127.0.0.1"
    moto_port: int = Field(ge=1024, le=65535)
    balancer_port: int = Field(ge=1024, le=65535)
    balancer_stats_port: int = Field(ge=1024, le=65535)
    autoscaler: LocalAutoscaler = LocalAutoscaler()


class KubernetesCluster(_Settings):
    """Which cluster the workloads run on: one this stack creates (EKS), or one that exists."""

    mode: Literal["create", "existing"]
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,99}$", description="EKS cluster name.")
    # The API version the manifests are validated against (kubernetes-validate ships 1.25-1.37).
    version: str = Field(pattern=r"^1\.(2[5-9]|3[0-7])$")
    private_endpoint: bool = Field(default=True, description="create: the API only inside the VPC.")
    # Where `pulumi up` runs. The same run applies the add-ons and the workloads through the cluster's
    # API, which a private endpoint serves only inside the VPC: "in-vpc" declares that the runner
    # reaches network.vpc_cidr (VPN, peering, Direct Connect, a runner in the VPC).
    deployer: Literal["outside", "in-vpc"] = "outside"
    kubeconfig: str = Field(default="", description="existing: path of the kubeconfig file.")
    context: str = Field(default="", description="existing: the kubeconfig context to use.")
    # Where the API server reaches pods from (the rollout gate reads pods' /metrics through its
    # proxy); the only source besides the ingress and Prometheus that the NetworkPolicy admits.
    # create: empty, the control-plane subnets this stack makes; existing: required.
    api_server_cidrs: tuple[str, ...] = ()
    # create: IAM roles or users (a CI pipeline's) made cluster admins by access entries. With EKS's
    # API authentication only the cluster's creator is one otherwise: another principal's later
    # `pulumi up` could not reach the cluster to apply the workloads.
    admins: tuple[
        Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[A-Za-z0-9+=,.@_/-]+$")], ...
    ] = ()

    @field_validator("api_server_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=True)
        return value


class Taint(_Settings):
    key: str = Field(pattern=r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodePool(_Settings):
    """GPU nodes for the runtime: the hardware of one ``node_groups`` entry, as Kubernetes sees it."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    node_group: str = Field(min_length=1, description="The node_groups entry with its GPUs and sizes.")
    instance_types: tuple[str, ...] = Field(
        default=(), description="EC2 types the managed node group may use; empty: the node group's own."
    )
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = (Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"),)
    # The weights cache is an emptyDir on the node's gp3 root volume: a new pod reads the model at
    # this rate before its startup probe runs out (125 is gp3's baseline; more costs extra).
    root_volume_throughput_mibps: int = Field(
        default=GP3_BASELINE_MIBPS, ge=GP3_BASELINE_MIBPS, le=GP3_MAX_MIBPS
    )


class SystemPool(_Settings):
    """The untainted CPU nodes of a created cluster: CoreDNS, the controllers and the add-ons."""

    instance_type: str = Field(default="m7i.large", min_length=1)
    min_size: int = Field(
        default=2, ge=1, le=100, description="Two: CoreDNS and the webhooks survive a node."
    )
    desired_size: int = Field(default=2, ge=1, le=100)
    max_size: int = Field(default=4, ge=1, le=100)
    root_volume_gb: int = Field(default=50, ge=20, le=16_384)


class KubernetesIngress(_Settings):
    # alb: the AWS Load Balancer Controller makes an ALB (IP targets) with edge.certificate_arn;
    # class: an ingress controller that already runs in the cluster, TLS from a Secret.
    kind: Literal["alb", "class"]
    class_name: str = Field(default="alb", pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
    host: str = Field(pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
    tls_secret: str = Field(default="", description="class: the Secret holding the certificate.")
    # alb: where the load balancer's addresses live (IP targets reach pods from there); empty: the
    # public subnets of network.vpc_cidr, which this stack creates.
    source_cidrs: tuple[str, ...] = ()
    controller_namespace: str = Field(
        default="ingress-nginx", description="class: where the controller runs."
    )
    controller_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "ingress-nginx"},
        description="class: the controller pods' labels (the only pods that may reach the runtime).",
    )

    @field_validator("source_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=True)
        return value


class KubernetesAutoscaling(_Settings):
    min_replicas: int = Field(ge=1, le=1000)
    max_replicas: int = Field(ge=1, le=1000)
    # Requests waiting per replica above which KEDA adds one (the runtime's queue-depth gauge).
    target_queue_depth: int = Field(ge=1, le=100_000)
    polling_interval_s: int = Field(default=15, ge=5, le=3600)
    cooldown_s: int = Field(default=300, ge=30, le=86_400)
    prometheus_url: str = Field(pattern=r"^https?://[A-Za-z0-9.:/_-]+$")


class KubernetesMonitoring(_Settings):
    prometheus_namespace: str = "monitoring"
    prometheus_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}
    )
    # Labels the Prometheus Operator selects ServiceMonitors by.
    service_monitor_labels: dict[str, str] = Field(default_factory=lambda: {"release": "prometheus"})
    scrape_interval_s: int = Field(default=15, ge=1, le=600)


class Kubernetes(_Settings):
    """The ``kubernetes`` target's own section (``frontier:kubernetes``): the cluster, its node
    pools, ingress, autoscaling and the pods' identity."""

    target: Literal["kubernetes"] = "kubernetes"
    cluster: KubernetesCluster
    namespace: str
    node_pools: tuple[NodePool, ...] = Field(min_length=1)
    ingress: KubernetesIngress
    autoscaling: KubernetesAutoscaling
    monitoring: KubernetesMonitoring = KubernetesMonitoring()
    system_pool: SystemPool = SystemPool()
    identity: Literal["pod_identity", "irsa"] = "pod_identity"
    runtime_role_arn: str = Field(
        default="", description="existing: the IAM role the runtime's service account assumes."
    )
    service_account: str = Field(default="frontier-runtime", pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    progress_deadline_s: int = Field(default=1800, ge=60, le=86_400)
    image: str = Field(
        default="",
        description="The runtime image `fab render` writes into manifests: <repository>@sha256:<64 hex>.",
    )
    weights_cache_gb: int = Field(default=200, ge=1, le=65_536)
    shm_gb: int = Field(default=16, ge=1, le=2048)
    run_as_user: int = Field(default=RUNTIME_UID, ge=1, le=2_147_483_647)
    # A stack with a gateway runs it as its own Deployment, from an image that carries
    # frontier-gateway (the runtime image does not), pinned by digest like the runtime's.
    gateway_image: str = Field(
        default="", description="The gateway's image: <repository>@sha256:<64 hex>; needed with a gateway."
    )
    gateway_role_arn: str = Field(
        default="", description="existing: the IAM role the gateway's service account assumes."
    )


class DisaggregatedRole(_Settings):
    """One half of a disaggregated pool: the node group its replicas run on, and how many.

    A stack file names the group (``node_group: h100-prefill``); :class:`Settings` puts the group
    itself in its place, as it does for a pool's own group."""

    group: NodeGroup
    replicas: int = Field(ge=1, le=1000, description="Replicas of this role.")


class Disaggregation(_Settings):
    """A pool's prefill and decode replicas on groups of their own (runtime ``kv_transfer.role``
    prefill and decode): the gateway sends each request's prompt to a prefill replica, which hands
    its KV blocks to the decode replica that streams the answer (``gateway/frontier_gateway/
    disaggregation.py``). Each group's hosts take their role from the group: a host runs one role,
    so the two groups differ, and the pool's ``node_group`` is its decode group."""

    prefill: DisaggregatedRole
    decode: DisaggregatedRole

    @model_validator(mode="after")
    def _roles_apart(self) -> Disaggregation:
        if self.prefill.group.name == self.decode.group.name:
            raise FieldProblems(
                FieldProblem(
                    "prefill.node_group",
                    self.prefill.group.name,
                    "must differ from decode.node_group: a host runs one role, and its group says which",
                )
            )
        return self

    def role_of(self, group: NodeGroup) -> KvRole | None:
        """The role ``group``'s hosts run, or None where the group is neither half."""
        if group.name == self.prefill.group.name:
            return "prefill"
        if group.name == self.decode.group.name:
            return "decode"
        return None


class PoolSettings(_Settings):
    """One model a stack serves, resolved: its model, runtime, node group, replicas and hosts.

    Clients name it by ``model.name`` in the ``model`` field of a request; the gateway routes there.
    A stack file writes a pool as ``frontier:model`` + ``frontier:runtime`` (a one-model stack) or as
    one entry of ``frontier:models`` naming its ``node_group`` and ``hosts``; :class:`Settings`
    resolves those names, so a pool carries the group and hosts themselves.
    """

    model: Model
    runtime: Runtime
    group: NodeGroup
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Replicas of this pool; empty: the node group's desired_size.",
    )
    hosts: tuple[Host, ...] = Field(
        default=(), description="Static inventory: the inventory.hosts that run this pool."
    )
    disaggregation: Disaggregation | None = None
    offline_for: str = Field(
        default="",
        max_length=512,
        description="An offline pool: the model whose batch work it takes. The gateway sends that "
        "model's batch requests here and never to its own replicas, and none of its interactive ones; "
        "its runtimes answer to that model's name too.",
    )

    @model_validator(mode="after")
    def _disaggregated_on_its_decode_group(self) -> PoolSettings:
        if self.disaggregation is None:
            return self
        problems = []
        if self.group.name != self.disaggregation.decode.group.name:
            problems.append(
                FieldProblem(
                    "node_group",
                    self.group.name,
                    f"a disaggregated pool's node_group is its decode group "
                    f"({self.disaggregation.decode.group.name!r}); leave it out or name that group",
                )
            )
        if self.replicas is not None:
            problems.append(
                FieldProblem("replicas", self.replicas, "a disaggregated pool counts replicas per role")
            )
        if not self.runtime.prefix_caching:
            problems.append(
                FieldProblem(
                    "runtime.prefix_caching",
                    False,
                    "must be true in a disaggregated pool: decode replicas enter pulled blocks by their hashes",
                )
            )
        if self.runtime.ranks > 1:
            problems.append(
                FieldProblem(
                    "runtime",
                    f"{self.runtime.ranks} ranks",
                    "a disaggregated pool's replicas run on one rank each: KV transfer moves one rank's cache",
                )
            )
        if self.runtime.kv_transfer.role != "both":
            problems.append(
                FieldProblem(
                    "runtime.kv_transfer.role",
                    self.runtime.kv_transfer.role,
                    "must be left 'both' in a disaggregated pool: each group's hosts take their role from disaggregation",
                )
            )
        if problems:
            raise FieldProblems(*problems)
        return self

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        """Every node group this pool's replicas run on: its own, and a disaggregated pool's prefill group."""
        if self.disaggregation is None:
            return (self.group,)
        return (self.disaggregation.prefill.group, self.disaggregation.decode.group)

    def runtime_on(self, group: NodeGroup) -> Runtime:
        """The runtime section the hosts of ``group`` run: the pool's, with the KV transfer role of
        a disaggregated pool's half that the group holds."""
        role = self.disaggregation.role_of(group) if self.disaggregation is not None else None
        if role is None:
            return self.runtime
        kv_transfer = self.runtime.kv_transfer.model_copy(update={"role": role})
        return Runtime.model_validate(
            {**self.runtime.model_dump(exclude={"kv_transfer"}), "kv_transfer": kv_transfer.model_dump()}
        )

    def on_groups(self, by_name: Mapping[str, NodeGroup]) -> PoolSettings:
        """This pool with each of its groups replaced by the group of the same name in ``by_name``."""
        update: dict[str, Any] = {"group": by_name.get(self.group.name, self.group)}
        if self.disaggregation is not None:
            halves = {
                half: role.model_copy(update={"group": by_name.get(role.group.name, role.group)})
                for half, role in (
                    ("prefill", self.disaggregation.prefill),
                    ("decode", self.disaggregation.decode),
                )
            }
            update["disaggregation"] = self.disaggregation.model_copy(update=halves)
        return self.model_copy(update=update)


class Gateway(GatewaySettings):
    """The stack's ``gateway:`` section: the gateway's own settings, plus the EC2 node group it runs on."""

    # EC2: the gateway's own small CPU node group behind the ALB.
    instance_type: str = Field(default="c7i.large", min_length=1)
    ami_id: str = Field(default="", pattern=r"^(ami-[0-9a-f]{8,17})?$", description="EC2: the pinned AMI.")
    min_size: int = Field(default=2, ge=1, le=100)
    desired_size: int = Field(default=2, ge=1, le=100)
    max_size: int = Field(default=4, ge=1, le=100)


class Ec2(_Settings):
    """The ``ec2`` target's section: hosts in auto scaling groups (or a static inventory) behind an
    ALB. What it reads is what every stack declares (node groups, network, edge); the file writes
    only ``frontier:target: ec2``, or nothing, since it is the default."""

    target: Literal["ec2"] = "ec2"


#: Where a stack's fleet runs, one typed section per target, told apart by ``target``.
TargetSection = Annotated[Local | Ec2 | Kubernetes, Field(discriminator="target")]

#: The targets with a section of their own, each written under the target's name (``frontier:local``,
#: ``frontier:kubernetes``), and what a stack of another target that writes one is told.
_FOREIGN_SECTION = {
    "local": "must be 'local' (or absent) in a stack with a 'local:' section",
    "kubernetes": "must be 'kubernetes' in a stack with a 'frontier:kubernetes' section",
}
TargetT = TypeVar("TargetT", Local, Ec2, Kubernetes)


class Settings(_Settings):
    """Every setting of one stack, typed. Built only by :func:`load_stack`."""

    stack: str
    source: str
    #: Where the fleet runs and that target's own section: ``ec2`` hosts, a ``kubernetes`` cluster
    #: (``frontier:kubernetes``) or ``local``, the embedded stack (``frontier:local``, which need not
    #: also say ``target``). Picks the backend, which reads its section through :meth:`section`.
    platform: TargetSection = Ec2()
    #: A production stack (``frontier:production: true``): its stateful resources are protected, its
    #: balancer has deletion protection, its logs are kept 90 days, its page alarms must reach
    #: someone, and the policy pack's production rules apply. Read through
    #: :func:`frontier.config.checks.is_production`, never from the stack's name.
    production: bool = False
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    network: Network
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1)
    #: Every model the stack serves, each on its own node group (see :class:`PoolSettings`).
    pools: tuple[PoolSettings, ...]
    #: The file lists its models (``frontier:models``) rather than writing one: each pool then keeps
    #: its own releases, history and lock (``models/<name>/`` under the stack's history prefix).
    listed_models: bool = False
    health: Health
    rollout: Rollout
    slo: Slo
    capacity: Capacity
    inventory: Inventory
    edge: Edge
    drivers: Drivers
    monitoring: Monitoring
    verify: Verify = Verify()
    releases: Releases = Releases()
    backup: Backup = Backup()
    gateway: Gateway | None = None
    tenants: tuple[TenantConfig, ...] = ()
    alerts: Alerts = Alerts()

    @model_validator(mode="before")
    @classmethod
    def _target_section(cls, data: object) -> object:
        """The file's ``target`` and its target's section as one typed ``platform``; a section of
        another target, or a target without its section, refused naming both."""
        if not isinstance(data, dict) or "platform" in data:
            return data
        data = dict(data)
        sections = {
            name: section for name in _FOREIGN_SECTION if (section := data.pop(name, None)) is not None
        }
        # The local stack has always been recognised by its section; it need not say so twice.
        target = data.pop("target", None) or ("local" if "local" in sections else "ec2")
        if target not in ("local", "ec2", "kubernetes"):
            raise FieldProblems(FieldProblem("target", target, "must be 'local', 'ec2' or 'kubernetes'"))
        problems = [
            FieldProblem("target", target, _FOREIGN_SECTION[other]) for other in sections if other != target
        ]
        if target in _FOREIGN_SECTION and target not in sections:
            problems.append(
                FieldProblem(target, None, f"target {target!r} needs its 'frontier:{target}' section")
            )
        if problems:
            raise FieldProblems(*problems)
        section = sections.get(target)
        built = section is not None and not isinstance(section, dict)  # a section already typed
        data["platform"] = section if built else {**(section or {}), "target": target}
        return data

    @property
    def target(self) -> Literal["local", "ec2", "kubernetes"]:
        """Where the fleet runs (``platform``'s tag): printed in tables and history."""
        return self.platform.target

    def section(self, kind: type[TargetT]) -> TargetT:
        """This stack's target section as ``kind`` (:class:`Local`, :class:`Ec2`, :class:`Kubernetes`),
        typed: what a target's code reads instead of an optional section it must check. A stack that
        runs elsewhere is refused naming its target."""
        if isinstance(self.platform, kind):
            return self.platform
        wanted = kind.model_fields["target"].default
        raise StackError(f"stack {self.stack!r} runs on target {self.target!r}, not {wanted!r}")

    @property
    def local(self) -> Local | None:
        """The local stack's section, None on another target (code of the local target reads
        ``section(Local)``)."""
        return self.platform if isinstance(self.platform, Local) else None

    @property
    def kubernetes(self) -> Kubernetes | None:
        """The Kubernetes section, None on another target (code of that target reads
        ``section(Kubernetes)``)."""
        return self.platform if isinstance(self.platform, Kubernetes) else None

    @model_validator(mode="before")
    @classmethod
    def _resolve_pools(cls, data: object) -> object:
        # A pool names its node group and hosts; every reader gets the group and hosts themselves.
        if not isinstance(data, dict) or not isinstance(data.get("pools"), list):
            return data
        groups = data.get("node_groups") or []
        inventory = data.get("inventory") or {}
        hosts = inventory.get("hosts") or [] if isinstance(inventory, dict) else []
        shared = (
            len(data["pools"]) > 1 and isinstance(inventory, dict) and inventory.get("source") == "static"
        )
        resolved, problems = [], []
        for i, pool in enumerate(data["pools"]):
            if isinstance(pool, dict):
                if shared and not pool.get("hosts"):
                    # Hosts run one pool each: with several, "all hosts" would be every pool's.
                    problems.append(
                        FieldProblem(
                            f"pools[{i}].hosts",
                            [],
                            "with several models, each pool must list the inventory.hosts it runs on",
                        )
                    )
                pool, wrong = _resolved_pool(pool, groups, hosts, f"pools[{i}]")
                problems.extend(wrong)
            resolved.append(pool)
        if problems:
            raise FieldProblems(*problems)
        return {**data, "pools": resolved}

    @model_validator(mode="after")
    def _pools_run_on_the_stacks_groups(self) -> Settings:
        if not self.pools:
            raise FieldProblems(FieldProblem("pools", [], "a stack serves at least one model"))
        problems = [
            FieldProblem(f"pools[{i}].group", pool.group.name, "must be one of node_groups, as written there")
            for i, pool in enumerate(self.pools)
            if pool.group not in self.node_groups
        ]
        problems.extend(self._disaggregation_problems())
        problems.extend(self._offline_problems())
        if self.backup.region == self.region:
            problems.append(
                FieldProblem(
                    "backup.region",
                    self.backup.region,
                    f"must differ from the stack's region {self.region!r}",
                )
            )
        sizes = {g.name: g.max_size for g in self.node_groups}
        for g in self.node_groups:
            if g.capacity is not None and g.capacity.market == "capacity-block":
                problems.extend(block_problems(g.name, g.capacity, sizes))
        if problems:
            raise FieldProblems(*problems)
        # Each pool holds the very node group the stack declares (``pool.group is node_groups[i]``).
        return self.model_copy(update={"node_groups": self.node_groups})

    def _disaggregation_problems(self) -> list[FieldProblem]:
        problems: list[FieldProblem] = []
        for i, pool in enumerate(self.pools):
            if pool.disaggregation is None:
                continue
            where = f"pools[{i}].disaggregation"
            halves = {
                pool.disaggregation.prefill.group.name: "prefill",
                pool.disaggregation.decode.group.name: "decode",
            }
            for other in self.pools:
                shared = sorted({g.name for g in other.groups} & set(halves)) if other is not pool else []
                problems.extend(
                    FieldProblem(
                        f"{where}.{halves[name]}.node_group",
                        name,
                        f"also runs pool {other.name!r}: a disaggregated half has its group to itself",
                    )
                    for name in shared
                )
            problems.extend(
                FieldProblem(
                    f"{where}.{half}.node_group",
                    role.group.name,
                    "must be one of node_groups, as written there",
                )
                for half, role in (
                    ("prefill", pool.disaggregation.prefill),
                    ("decode", pool.disaggregation.decode),
                )
                if role.group not in self.node_groups
            )
        return problems

    def _offline_problems(self) -> list[FieldProblem]:
        """An offline pool takes the batch work of another pool of the stack, through the gateway
        (where requests are told apart by priority), and serves the same weights."""
        problems: list[FieldProblem] = []
        by_name = {pool.name: pool for pool in self.pools}
        for i, pool in enumerate(self.pools):
            if pool.model.aliases:
                problems.append(
                    FieldProblem(
                        f"pools[{i}].model.aliases",
                        list(pool.model.aliases),
                        "is not written in a stack: an offline pool's runtimes answer to the name of "
                        "the model it names in offline_for",
                    )
                )
            if not pool.offline_for:
                continue
            where, taken = f"pools[{i}].offline_for", by_name.get(pool.offline_for)
            if taken is None or taken is pool:
                others = sorted(name for name in by_name if name != pool.name)
                problems.append(
                    FieldProblem(where, pool.offline_for, f"must name another model of the stack ({others})")
                )
                continue
            if taken.offline_for:
                problems.append(
                    FieldProblem(
                        where,
                        pool.offline_for,
                        f"names an offline pool itself (it takes {taken.offline_for!r}'s batch work): "
                        "name the model whose interactive pool it is",
                    )
                )
            givers = [p.name for p in self.pools if p.offline_for == pool.offline_for]
            if len(givers) > 1:
                problems.append(
                    FieldProblem(
                        where, pool.offline_for, f"is named by {givers}: a model has one offline pool"
                    )
                )
            if (pool.model.weights_uri, pool.model.version) != (taken.model.weights_uri, taken.model.version):
                problems.append(
                    FieldProblem(
                        f"pools[{i}].model.weights_uri",
                        pool.model.weights_uri,
                        f"must be {pool.offline_for!r}'s weights ({taken.model.weights_uri}, version "
                        f"{taken.model.version!r}): batch requests for that model get its answers",
                    )
                )
            if self.gateway is None:
                problems.append(
                    FieldProblem(
                        where,
                        pool.offline_for,
                        "needs the stack's gateway (frontier:gateway): it tells batch requests from "
                        "interactive ones and sends each to its pool",
                    )
                )
        return problems

    @property
    def only_pool(self) -> PoolSettings:
        """The pool of a stack that serves one model, or of one pool's view (:meth:`for_pool`).

        A stack of several models has no such pool: code that acts for a pool is handed the one it
        acts for, and reading this there is refused rather than answered with the first pool.
        """
        if len(self.pools) != 1:
            raise self.several_models("name the pool to act for")
        return self.pools[0]

    def several_models(self, what: str) -> StackError:
        """The refusal of what acts for one pool on a stack of several, its models named; ``what``
        says what to do instead."""
        return StackError(
            f"stack {self.stack!r} serves {len(self.pools)} models ({self.model_names()}): {what}"
        )

    @property
    def model(self) -> Model:
        """:attr:`only_pool`'s model: a one-model stack's, for its tests and what-if copies; the
        toolkit's own code is handed the pool it acts for (``tests/unit/test_pool_reads.py``)."""
        return self.only_pool.model

    @property
    def runtime(self) -> Runtime:
        """:attr:`only_pool`'s runtime."""
        return self.only_pool.runtime

    @property
    def serving_group(self) -> NodeGroup:
        """:attr:`only_pool`'s node group."""
        return self.only_pool.group

    @property
    def api_keys_secrets(self) -> dict[str, str]:
        """Each pool's API-keys secret (its Secrets Manager id) by model name: a pool's runtimes read
        their own, no other pool's (the stack check holds the pools to different ones)."""
        return {pool.name: pool.runtime.api_keys_secret or "" for pool in self.pools}

    # What the stack builds once for every pool: one image repository, one weights location. Each
    # pool's section names it; the stack check holds the pools to the same one.

    @property
    def image_repository(self) -> str:
        """The runtime image's repository, which every pool's runtime comes from."""
        return self._shared(
            "runtime.image_repository", {pool.runtime.image_repository for pool in self.pools}
        )

    @property
    def weights_root(self) -> str:
        """``s3://bucket/prefix`` holding every pool's weights: their bucket, and the prefix they share."""
        buckets = {pool.model.weights_uri.removeprefix("s3://").split("/", 1)[0] for pool in self.pools}
        bucket = self._shared("model.weights_uri's bucket", buckets)
        paths = [
            pool.model.weights_uri.removeprefix(f"s3://{bucket}").strip("/").split("/") for pool in self.pools
        ]
        common = []
        for parts in zip(*paths, strict=False):
            if len(set(parts)) != 1:
                break
            common.append(parts[0])
        return "/".join([f"s3://{bucket}", *common])

    def _shared(self, field: str, values: set[str]) -> str:
        if len(values) != 1:
            raise StackError(
                f"stack {self.stack!r}: every pool's {field} must be the same, got {', '.join(sorted(values))}"
            )
        return values.pop()

    def for_pool(self, name: str) -> Settings:
        """These settings narrowed to the pool serving model ``name``: it is then their only pool,
        and the inventory holds its hosts: what an entry point (``fab deploy --model``) rolls, its
        history, lock and hosts those of that pool."""
        pool = self.pool(name)
        inventory = self.inventory.model_copy(update={"hosts": pool.hosts})
        return self.model_copy(update={"pools": (pool,), "inventory": inventory})

    def pool(self, name: str) -> PoolSettings:
        """The pool serving model ``name``; KeyError naming the models served otherwise."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(
            f"model {name!r} is not served by stack {self.stack!r}: it serves " + self.model_names()
        )

    def model_names(self) -> str:
        return ", ".join(pool.name for pool in self.pools)

    def pools_on(self, group: NodeGroup) -> tuple[PoolSettings, ...]:
        """The pools whose replicas run on ``group``: its own, and that of a Capacity Block group
        whose fallback it is (it takes the block's hosts when the block ends)."""
        return tuple(
            pool
            for pool in self.pools
            if any(own.name == group.name or falls_back_to(own, group) for own in pool.groups)
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Settings:
        """A copy with ``update``, its pools kept on the node groups it declares: new ``node_groups``
        reach the pools that run on them, and a one-pool stack's ``model`` or ``runtime`` is its pool's."""
        changes = dict(update or {})
        # A target's section is replaced whole, by its own key or by ``platform``.
        for key in _FOREIGN_SECTION:
            if key in changes:
                changes["platform"] = changes.pop(key)
        of_pool: dict[str, Any] = {key: changes.pop(key) for key in ("model", "runtime") if key in changes}
        copy = super().model_copy(update=changes, deep=deep)
        if "node_groups" in changes:
            by_name = {group.name: group for group in copy.node_groups}
            pools = tuple(pool.on_groups(by_name) for pool in copy.pools)
            copy = super(Settings, copy).model_copy(update={"pools": pools})
        if of_pool:
            copy = copy.with_pool(copy.only_pool.model_copy(update=of_pool))
        return copy

    def with_pool(self, pool: PoolSettings) -> Settings:
        """These settings with the pool of the same name replaced by ``pool``, and its node group
        replaced where node_groups declares it (what-if copies: the planner's candidates, tests)."""
        old = self.pool(pool.name).group
        groups = tuple(pool.group if group.name == old.name else group for group in self.node_groups)
        by_name = {group.name: group for group in groups}
        pools = tuple(pool if p.name == pool.name else p.on_groups(by_name) for p in self.pools)
        return self.model_copy(update={"node_groups": groups, "pools": pools})

    def alert_route(self, severity: Severity) -> AlertRoute:
        """Where ``severity``'s alarms go: its ``alerts.routes`` entry, with ``monitoring.alarm_email``
        (the one on-call address older stack files give) on the page route."""
        return self.alerts.route(severity, self.monitoring.alarm_email)


def _resolved_pool(
    pool: dict[str, object], groups: list[object], hosts: list[object], where: str
) -> tuple[dict[str, object], list[FieldProblem]]:
    """A pool as written (``node_group`` and ``hosts`` by name; no group: the first, no hosts: all)
    with its group and hosts in their place, and the names that match none."""
    pool = dict(pool)
    problems = []
    halves = pool.get("disaggregation")
    if isinstance(halves, dict):
        # Each half names its group as the pool does; the pool's own group is its decode group.
        halves = dict(halves)
        for half in ("prefill", "decode"):
            role = halves.get(half)
            if isinstance(role, dict) and "group" not in role:
                role = dict(role)
                name = role.pop("node_group", None)
                named = [g for g in groups if isinstance(g, dict) and g.get("name") == name]
                if named:
                    role["group"] = named[0]
                else:
                    known = ", ".join(str(g.get("name")) for g in groups if isinstance(g, dict))
                    problems.append(
                        FieldProblem(
                            f"{where}.disaggregation.{half}.node_group",
                            name,
                            f"must name one of node_groups ({known})",
                        )
                    )
                halves[half] = role
        pool["disaggregation"] = halves
        decode = halves.get("decode")
        if "group" not in pool and not pool.get("node_group") and isinstance(decode, dict):
            pool["group"] = decode.get("group")
    if "group" not in pool:
        name = pool.pop("node_group", "") or ""
        named = [g for g in groups if isinstance(g, dict) and g.get("name") == name]
        if named or not name:
            pool["group"] = named[0] if named else (groups[0] if groups else None)
        else:
            known = ", ".join(str(g.get("name")) for g in groups if isinstance(g, dict))
            problems.append(
                FieldProblem(f"{where}.node_group", name, f"must name one of node_groups ({known})")
            )
    names = pool.get("hosts")
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        by_name = {h.get("name"): h for h in hosts if isinstance(h, dict)}
        if names:
            pool["hosts"] = [by_name.get(n, n) for n in names]
            known = ", ".join(str(n) for n in by_name)
            problems.extend(
                FieldProblem(f"{where}.hosts[{j}]", n, f"must name one of inventory.hosts ({known})")
                for j, n in enumerate(names)
                if n not in by_name
            )
        else:
            pool["hosts"] = list(hosts)
    elif "hosts" not in pool:
        pool["hosts"] = list(hosts)
    return pool, problems


def runtime_config(model: Model, runtime: Runtime, **derived: object) -> RuntimeConfig:
    """The runtime's config for one pool: its runtime section and the runtime's part of its model,
    field for field, with ``derived`` (health, device, ...) from the stack's other sections."""
    return RuntimeConfig.model_validate(
        {
            **runtime.model_dump(include=set(RuntimeSettings.model_fields)),
            "model": model.model_dump(include=set(ModelConfig.model_fields)),
            **derived,
        }
    )
