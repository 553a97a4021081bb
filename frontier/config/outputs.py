"""The stack outputs: what a cloud stack's Pulumi program exports and ``fab`` reads back.

One model per target, the fields both targets export in :class:`StackOutputs`. Each model is generic
in the type of a value the cloud assigns: the program builds ``Ec2Outputs[pulumi.Input[str]]`` (a
value is still a promise while the program runs) and exports its fields, so a field the program
leaves out is a missing argument; the toolkit validates the saved ``pulumi stack output --json``
into ``Ec2Outputs[str]``, so reading an output no program exports is an attribute that does not
exist, and a saved file that lacks one fails when it is read, naming the output.

The models live here, beside the stack's settings, rather than in ``infra/``: the backends import
them, and the toolkit must run (and import) without Pulumi, which only ``infra/`` needs.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

#: A value the cloud assigns: ``str`` once saved, ``pulumi.Input[str]`` while the program runs.
Value = TypeVar("Value")


class StackOutputs(BaseModel, Generic[Value]):
    """What every cloud stack exports: where its history, weights and image live, its key and
    secret, the roles ``fab`` and the runtime act as, and the URL clients call."""

    # A file saved by a newer program may hold outputs this toolkit does not know: they are ignored.
    model_config = ConfigDict(frozen=True, extra="ignore")

    region: str
    weights_bucket: Value
    weights_prefix: str
    history_bucket: Value
    history_prefix: str
    ecr_repository_url: Value
    #: A one-model stack's API-keys secret; "" where the stack serves several (see api_keys_secret_arns).
    api_keys_secret_arn: Value
    #: Each pool's API-keys secret by model name: its runtimes accept the keys there, and only its
    #: principal (and the gateway, the probe and the deploy role) reads it.
    api_keys_secret_arns: dict[str, Value] = {}
    kms_key_arn: Value
    #: The release key (infra/release_key.py): releases are signed with it and hosts run only what
    #: it signed. None in a file saved by a program from before release keys.
    release_key_arn: Value | None = None
    deploy_role_arn: Value
    #: A one-model stack's runtime role; "" where the stack serves several (see runtime_role_arns).
    runtime_role_arn: Value
    #: Each pool's runtime role by model name: its hosts or pods run as that principal alone.
    runtime_role_arns: dict[str, Value] = {}
    #: The base URL of the OpenAI-compatible API (``fab loadtest`` and ``fab batch`` without ``--url``).
    endpoint: Value


class Ec2Outputs(StackOutputs[Value], Generic[Value]):
    """An ``ec2`` stack: its load balancer and target group, node groups, network and alarms."""

    target_group_arn: Value
    #: A stack that rolls by traffic share (``rollout.traffic_steps``) with the ALB in front of its
    #: runtimes: the second target group the new release's hosts serve from, and the API's listener
    #: rule whose forward action weighs the two groups. None elsewhere.
    canary_target_group_arn: Value | None = None
    api_rule_arn: Value | None = None
    asg_names: list[Value]
    alb_dns_name: Value
    alb_zone_id: Value
    alarm_topic_arn: Value
    dashboard_name: Value
    vpc_id: Value
    private_subnet_ids: list[Value]
    host_access: Literal["bastion", "ssm"]
    # None without a bastion; a saved file may leave an output that is None out.
    bastion_security_group_id: Value | None = None
    #: The group a metrics scraper joins: the only source besides the ALB of the runtime port.
    monitoring_security_group_id: Value
    #: The primary endpoint of the quota store the stack provisions for its gateways
    #: (``gateway.quota.store: redis`` with no ``redis_url``); None without one.
    quota_store_endpoint: Value | None = None


class KubernetesOutputs(StackOutputs[Value], Generic[Value]):
    """A ``kubernetes`` stack: the cluster, and the namespace and Deployment the runtime runs as."""

    cluster_name: Value
    namespace: str
    deployment: str
