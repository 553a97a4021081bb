"""The load balancer (infra/edge.py): HTTPS only, TLS 1.2 or newer, access logs, and only the API
forwarded to the hosts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from policy.rules.reading import as_list, get, truthy
from policy.rules.validation import resource_policy

TLS12_POLICY = re.compile(r"TLS13|TLS-1-2|FS-1-2")
LISTENER = ("aws:lb/listener:Listener", "aws:alb/listener:Listener")
LOAD_BALANCER = ("aws:lb/loadBalancer:LoadBalancer", "aws:alb/loadBalancer:LoadBalancer")
LISTENER_RULE = ("aws:lb/listenerRule:ListenerRule", "aws:alb/listenerRule:ListenerRule")
TARGET_GROUP = ("aws:lb/targetGroup:TargetGroup", "aws:alb/targetGroup:TargetGroup")
WEB_ACL_ASSOCIATION = ("aws:wafv2/webAclAssociation:WebAclAssociation",)
# Only the API is public; /metrics and /health/* answer inside the VPC alone.
PUBLIC_PATH_PREFIX = "/v1/"


def check_http_redirects(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if str(get(props, "protocol", default="")).upper() != "HTTP":
        return
    for action in as_list(get(props, "defaultActions")):
        kind = get(action, "type")
        target = str(get(action, "redirect", "protocol", default="")).upper()
        if kind != "redirect" or target != "HTTPS":
            yield f"HTTP listener {kind!r} action serves plain HTTP; it must redirect to HTTPS"


def check_tls_policy(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if str(get(props, "protocol", default="")).upper() not in ("HTTPS", "TLS"):
        return
    policy = str(get(props, "sslPolicy", default=""))
    if not TLS12_POLICY.search(policy):
        yield f"listener TLS policy {policy or '(default)'!r} allows TLS older than 1.2"


def check_lb_access_logs(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    logs = get(props, "accessLogs", default={})
    if not truthy(get(logs, "enabled")) or not get(logs, "bucket"):
        yield "load balancer does not write access logs"


def check_listener_forwards_only_api(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if str(get(props, "protocol", default="")).upper() not in ("HTTPS", "TLS"):
        return
    for action in as_list(get(props, "defaultActions")):
        if get(action, "type") == "forward":
            yield "HTTPS listener forwards every path by default: /metrics and /health/* would answer the internet"


def not_api(path: Any) -> bool:
    # "/v1" is the API too: an Ingress Prefix path matches by whole path elements (/v1, /v1/...).
    text = str(path or "")
    return not (text.startswith(PUBLIC_PATH_PREFIX) or text == PUBLIC_PATH_PREFIX.rstrip("/"))


def check_listener_rules_api_only(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not any(get(a, "type") == "forward" for a in as_list(get(props, "actions"))):
        return
    paths = [p for c in as_list(get(props, "conditions")) for p in as_list(get(c, "pathPattern", "values"))]
    if not paths:
        yield f"listener rule forwards without a path condition: only {PUBLIC_PATH_PREFIX}* may be public"
    for path in filter(not_api, paths):
        yield f"listener rule forwards {path!r}: only {PUBLIC_PATH_PREFIX}* may be public"


POLICIES = [
    resource_policy(
        "alb-http-redirects-to-https",
        "HTTP listeners only redirect to HTTPS.",
        LISTENER,
        check_http_redirects,
    ),
    resource_policy(
        "alb-tls-1-2", "HTTPS listeners use a TLS 1.2+ security policy.", LISTENER, check_tls_policy
    ),
    resource_policy(
        "lb-access-logs", "Load balancers write access logs.", LOAD_BALANCER, check_lb_access_logs
    ),
    resource_policy(
        "alb-forwards-only-api",
        "HTTPS listeners forward nothing by default (listener rules name the API paths).",
        LISTENER,
        check_listener_forwards_only_api,
    ),
    resource_policy(
        "alb-listener-rules-forward-only-api",
        "ALB listener rules forward only /v1/ paths.",
        LISTENER_RULE,
        check_listener_rules_api_only,
    ),
]
