"""Monitoring: log groups, the alarm topic, CloudWatch alarms against the stack's SLOs, a dashboard.

Alarms:
- ALB 5xx rate (ELB + target 5xx over requests, metric math) above ``slo.error_rate``;
- target p99 response time above ``slo.p99_latency_ms``;
- any unhealthy host in the target group;
- runtime queue depth above ``monitoring.queue_depth_alarm``.

The runtime's hosts publish ``QueueDepth`` in the ``Frontier/Runtime`` namespace with one dimension,
``Stack`` (see :func:`queue_depth_dimensions`); the alarm reads exactly that series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from frontier.config.schema import Slo
from frontier.contracts import CLOUDWATCH_NAMESPACE as METRIC_NAMESPACE
from frontier.contracts import QUEUE_DEPTH_METRIC

LOG_GROUP_ROOT = "/frontier"
ALB_NAMESPACE = "AWS/ApplicationELB"
PERIOD_S = 60
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3


def queue_depth_dimensions(stack: str) -> dict[str, str]:
    return {"Stack": stack}


@dataclass(frozen=True)
class MonitoringArgs:
    stack: str
    region: str
    slo: Slo
    queue_depth_alarm: int
    alarm_email: str
    kms_key_arn: pulumi.Input[str]
    log_retention_days: int
    alb_arn_suffix: pulumi.Input[str]
    target_group_arn_suffix: pulumi.Input[str]
    asg_names: Sequence[pulumi.Input[str]]
    tags: Mapping[str, str]


def error_rate_queries(alb: pulumi.Input[str]) -> list[dict[str, Any]]:
    """(ELB 5xx + target 5xx) / requests per minute; no traffic is no data, not an error rate of 0/0."""

    def count(query_id: str, metric: str) -> dict[str, Any]:
        return {
            "id": query_id,
            "return_data": False,
            "metric": {
                "namespace": ALB_NAMESPACE,
                "metric_name": metric,
                "dimensions": {"LoadBalancer": alb},
                "period": PERIOD_S,
                "stat": "Sum",
            },
        }

    return [
        count("elb5xx", "HTTPCode_ELB_5XX_Count"),
        count("target5xx", "HTTPCode_Target_5XX_Count"),
        count("requests", "RequestCount"),
        {
            "id": "errorrate",
            "expression": "(FILL(elb5xx, 0) + FILL(target5xx, 0)) / requests",
            "label": "5xx / requests",
            "return_data": True,
        },
    ]


class Monitoring(pulumi.ComponentResource):
    topic_arn: pulumi.Output[str]
    runtime_log_group: pulumi.Output[str]
    dashboard_name: pulumi.Output[str]

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:monitoring:Monitoring", name, None, opts)
        self._name, self._args = name, args
        self._child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        groups = {
            purpose: aws.cloudwatch.LogGroup(
                f"{name}-{purpose}",
                name=f"{LOG_GROUP_ROOT}/{args.stack}/{purpose}",
                retention_in_days=args.log_retention_days,
                kms_key_id=args.kms_key_arn,
                tags=tags,
                opts=self._child,
            )
            for purpose in ("runtime", "cloud-init")
        }
        topic = aws.sns.Topic(
            f"{name}-alarms",
            display_name=f"Frontier {args.stack} alarms",
            kms_master_key_id=args.kms_key_arn,
            tags=tags,
            opts=self._child,
        )
        if args.alarm_email:
            # Email subscriptions stay pending until the recipient confirms the mail AWS sends.
            aws.sns.TopicSubscription(
                f"{name}-alarms-email",
                topic=topic.arn,
                protocol="email",
                endpoint=args.alarm_email,
                opts=self._child,
            )
        self._alarms(topic.arn)
        dashboard = self._dashboard()

        self.topic_arn = topic.arn
        self.runtime_log_group = groups["runtime"].name
        self.dashboard_name = dashboard.dashboard_name
        self.register_outputs({"topic_arn": topic.arn, "dashboard": dashboard.dashboard_name})

    def _alarm(self, key: str, description: str, topic_arn: pulumi.Output[str], **kwargs: Any) -> None:
        args = self._args
        aws.cloudwatch.MetricAlarm(
            f"{self._name}-{key}",
            name=f"frontier-{args.stack}-{key}",
            alarm_description=description,
            comparison_operator="GreaterThanThreshold",
            evaluation_periods=EVALUATION_PERIODS,
            datapoints_to_alarm=DATAPOINTS_TO_ALARM,
            treat_missing_data="notBreaching",
            alarm_actions=[topic_arn],
            ok_actions=[topic_arn],
            tags=dict(args.tags),
            opts=self._child,
            **kwargs,
        )

    def _alarms(self, topic_arn: pulumi.Output[str]) -> None:
        args, slo = self._args, self._args.slo
        lb_and_tg = {"LoadBalancer": args.alb_arn_suffix, "TargetGroup": args.target_group_arn_suffix}
        self._alarm(
            "5xx-rate",
            f"5xx responses above the SLO error rate ({slo.error_rate:.2%}) for 3 of 5 minutes",
            topic_arn,
            threshold=slo.error_rate,
            metric_queries=error_rate_queries(args.alb_arn_suffix),
        )
        self._alarm(
            "p99-latency",
            f"Target p99 response time above the SLO ({slo.p99_latency_ms:.0f} ms) for 3 of 5 minutes",
            topic_arn,
            namespace=ALB_NAMESPACE,
            metric_name="TargetResponseTime",  # seconds
            dimensions=lb_and_tg,
            extended_statistic="p99",
            period=PERIOD_S,
            threshold=slo.p99_latency_ms / 1000,
        )
        self._alarm(
            "unhealthy-hosts",
            "A runtime host fails the readiness check (drained hosts are not counted)",
            topic_arn,
            namespace=ALB_NAMESPACE,
            metric_name="UnHealthyHostCount",
            dimensions=lb_and_tg,
            statistic="Maximum",
            period=PERIOD_S,
            threshold=0,
        )
        self._alarm(
            "queue-depth",
            f"Requests waiting in a runtime's queue above {args.queue_depth_alarm}",
            topic_arn,
            namespace=METRIC_NAMESPACE,
            metric_name=QUEUE_DEPTH_METRIC,
            dimensions=queue_depth_dimensions(args.stack),
            statistic="Maximum",
            period=PERIOD_S,
            threshold=args.queue_depth_alarm,
        )

    def _dashboard(self) -> aws.cloudwatch.Dashboard:
        args = self._args
        alb, tg = args.alb_arn_suffix, args.target_group_arn_suffix

        def widget(title: str, metrics: list, y: int, x: int = 0, **props: Any) -> dict[str, Any]:
            return {
                "type": "metric",
                "x": x,
                "y": y,
                "width": 12,
                "height": 6,
                "properties": {
                    "title": title,
                    "region": args.region,
                    "metrics": metrics,
                    "period": PERIOD_S,
                    **props,
                },
            }

        body = {
            "widgets": [
                widget(
                    "Requests", [[ALB_NAMESPACE, "RequestCount", "LoadBalancer", alb, {"stat": "Sum"}]], 0
                ),
                widget(
                    "5xx",
                    [
                        [ALB_NAMESPACE, "HTTPCode_ELB_5XX_Count", "LoadBalancer", alb, {"stat": "Sum"}],
                        [ALB_NAMESPACE, "HTTPCode_Target_5XX_Count", "LoadBalancer", alb, {"stat": "Sum"}],
                    ],
                    0,
                    12,
                ),
                widget(
                    "Target response time p50 / p99 (s)",
                    [
                        [
                            ALB_NAMESPACE,
                            "TargetResponseTime",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "p50"},
                        ],
                        [
                            ALB_NAMESPACE,
                            "TargetResponseTime",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "p99"},
                        ],
                    ],
                    6,
                    annotations={
                        "horizontal": [{"label": "SLO p99", "value": args.slo.p99_latency_ms / 1000}]
                    },
                ),
                widget(
                    "Healthy / unhealthy hosts",
                    [
                        [
                            ALB_NAMESPACE,
                            "HealthyHostCount",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "Minimum"},
                        ],
                        [
                            ALB_NAMESPACE,
                            "UnHealthyHostCount",
                            "LoadBalancer",
                            alb,
                            "TargetGroup",
                            tg,
                            {"stat": "Maximum"},
                        ],
                    ],
                    6,
                    12,
                ),
                widget(
                    "Runtime queue depth",
                    [[METRIC_NAMESPACE, QUEUE_DEPTH_METRIC, "Stack", args.stack, {"stat": "Maximum"}]],
                    12,
                    annotations={"horizontal": [{"label": "alarm", "value": args.queue_depth_alarm}]},
                ),
                widget(
                    "Hosts in service",
                    [
                        [
                            "AWS/AutoScaling",
                            "GroupInServiceInstances",
                            "AutoScalingGroupName",
                            asg,
                            {"stat": "Average"},
                        ]
                        for asg in args.asg_names
                    ],
                    12,
                    12,
                ),
            ]
        }
        return aws.cloudwatch.Dashboard(
            f"{self._name}-dashboard",
            dashboard_name=f"frontier-{args.stack}",
            dashboard_body=pulumi.Output.json_dumps(body),
            opts=self._child,
        )
