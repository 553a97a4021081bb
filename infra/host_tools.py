"""Host tools: what a host fetches at boot to bootstrap itself, uploaded beside the releases.

Under ``<history prefix>host/<node group>/`` of the history bucket: the host agent and the
bootstrap (their source files, byte for byte what the tests run) with ``frontier_hostside/``, the
names they import (cloud-init's recursive copy makes it a folder beside them), the agent's configuration
(rendered for the stack; the bootstrap fills in the host's name and address), the driver and
model-cache scripts of the group, and the CloudWatch agent's configuration. cloud-init stays thin
(EC2 user data is limited to 16 KB) and fetches them; the runtime role may read only this prefix,
the releases and the deploy records (see :mod:`frontier.identity.documents`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import frontier_hostside
import pulumi
import pulumi_aws as aws
from frontier_hostside.names import (
    AGENT_CONFIG_NAME,
    HOST_ROOT,
    HOST_TOOLS_PREFIX,
    PLACEHOLDER_ADDRESS,
    PLACEHOLDER_HOST,
)

from frontier.config.schema import NodeGroup, Settings
from frontier.release.history import pool_history_prefix
from frontier.render.boot import group_pool, render_cloudwatch_agent, render_driver_script, render_mount_cache
from frontier.render.host import render_agent_config


def host_tools(settings: Settings, group: NodeGroup) -> dict[str, str]:
    """File name -> content, for one node group."""
    files = {
        **{name: data.decode() for name, data in frontier_hostside.host_tools().items()},
        "mount-cache.sh": render_mount_cache(settings, group),
        "cloudwatch-agent.json": render_cloudwatch_agent(settings, group),
    }
    if settings.pools_on(group):
        # The agent supervises the runtime of the group's pool; the bootstrap writes the host's own
        # name and address over the placeholders.
        files[AGENT_CONFIG_NAME] = render_agent_config(
            settings,
            group_pool(settings, group),
            host=PLACEHOLDER_HOST,
            root=HOST_ROOT,
            python="/usr/bin/python3",
            address=PLACEHOLDER_ADDRESS,
        )
    if group.accelerator == "gpu":
        files["install-nvidia.sh"] = render_driver_script(settings, group)
    return dict(sorted(files.items()))


@dataclass(frozen=True)
class HostToolsArgs:
    settings: Settings
    history_bucket: pulumi.Input[str]
    history_prefix: str
    kms_key_arn: pulumi.Input[str]
    tags: Mapping[str, str]


class HostTools(pulumi.ComponentResource):
    def __init__(self, name: str, args: HostToolsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:hosts:HostTools", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.keys: list[str] = []
        for group in args.settings.node_groups:
            # Under the history of the pool the group's hosts boot (node.env's prefix), which is
            # what that pool's principal may read.
            prefix = pool_history_prefix(
                args.settings, group_pool(args.settings, group).name, args.history_prefix
            )
            for file_name, content in host_tools(args.settings, group).items():
                key = f"{prefix}{HOST_TOOLS_PREFIX}{group.name}/{file_name}"
                aws.s3.BucketObjectv2(
                    f"{name}-{group.name}-{file_name}",
                    bucket=args.history_bucket,
                    key=key,
                    content=content,
                    server_side_encryption="aws:kms",
                    kms_key_id=args.kms_key_arn,
                    tags=dict(args.tags),
                    opts=child,
                )
                self.keys.append(key)
        self.register_outputs({"keys": self.keys})
