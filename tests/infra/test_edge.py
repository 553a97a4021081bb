"""Edge: a public ALB that speaks HTTPS only, health checks on readiness, drains, logs, rate limits."""

from __future__ import annotations

import fnmatch

from infra.edge import TARGET_TLS_PORT

LB = "aws:lb/loadBalancer:LoadBalancer"
LISTENER = "aws:lb/listener:Listener"
RULE = "aws:lb/listenerRule:ListenerRule"
TG = "aws:lb/targetGroup:TargetGroup"


def listener(graph, port):
    [found] = [r.inputs for r in graph.of_type(LISTENER) if r.inputs["port"] == port]
    return found


def test_the_alb_is_internet_facing_in_the_public_subnets(graph):
    alb = graph.one(LB).inputs
    public = [
        s.id for s in graph.of_type("aws:ec2/subnet:Subnet") if s.inputs["tags"]["frontier:tier"] == "public"
    ]
    assert alb["internal"] is False and alb["loadBalancerType"] == "application"
    # Resources register concurrently under the mocks, so the graph's order of subnets is not the
    # program's: compare the sets (and that no subnet is listed twice).
    assert len(alb["subnets"]) == len(public) and set(alb["subnets"]) == set(public)


def test_the_alb_uses_only_its_own_security_group(graph):
    alb_sg = graph.one("aws:ec2/securityGroup:SecurityGroup", f"{graph.stack}-sg-alb").id
    assert graph.one(LB).inputs["securityGroups"] == [alb_sg]


def test_the_alb_writes_access_logs_to_the_log_bucket(graph):
    logs = graph.one(LB).inputs["accessLogs"]
    log_bucket = next(
        b
        for b in graph.of_type("aws:s3/bucket:Bucket")
        if b.inputs["tags"]["frontier:purpose"] == "access-logs"
    )
    assert logs == {"bucket": log_bucket.outputs["bucket"], "prefix": "alb", "enabled": True}


def test_deletion_protection_only_in_production(graph):
    assert graph.one(LB).inputs["enableDeletionProtection"] is graph.settings.production


def test_the_idle_timeout_follows_the_stack_and_bad_headers_are_dropped(graph):
    alb = graph.one(LB).inputs
    assert alb["idleTimeout"] == graph.settings.edge.idle_timeout_s
    assert alb["dropInvalidHeaderFields"] is True


def test_https_listener_uses_the_stacks_certificate_and_tls_policy(graph):
    https = listener(graph, 443)
    assert https["protocol"] == "HTTPS"
    assert https["certificateArn"] == graph.settings.edge.certificate_arn
    assert https["sslPolicy"] == graph.settings.edge.ssl_policy
    assert [action["type"] for action in https["defaultActions"]] == ["fixed-response"]


def _route(graph, path: str) -> str:
    """Where the HTTPS listener sends ``path``: the target group ARN, or the fixed status code.

    ALB path patterns are case-sensitive globs (``*``, ``?``) over the path; rules go by priority.
    """
    https = next(r for r in graph.of_type(LISTENER) if r.inputs["port"] == 443)
    rules = sorted(
        (r.inputs for r in graph.of_type(RULE) if r.inputs["listenerArn"] == https.outputs["arn"]),
        key=lambda rule: rule["priority"],
    )
    for rule in rules:
        patterns = [v for c in rule["conditions"] for v in c["pathPattern"]["values"]]
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns):
            [action] = rule["actions"]
            return action["targetGroupArn"]
    [default] = https.inputs["defaultActions"]
    return default["fixedResponse"]["statusCode"]


def test_the_load_balancer_forwards_only_the_api_paths(graph):
    target_group = graph.outputs["target_group_arn"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models"):
        assert _route(graph, path) == target_group, path
    for path in ("/metrics", "/health/ready", "/health/live", "/", "/v1", "/V1/completions", "/admin/v1/x"):
        assert _route(graph, path) == "404", path


def test_http_only_redirects_to_https(graph):
    http = listener(graph, 80)
    assert http["protocol"] == "HTTP"
    assert http["defaultActions"] == [
        {"type": "redirect", "redirect": {"protocol": "HTTPS", "port": "443", "statusCode": "HTTP_301"}}
    ]


def test_the_health_check_probes_readiness_with_the_stacks_timings(graph):
    health = graph.settings.health
    check = graph.one(TG).inputs["healthCheck"]
    assert check["path"] == health.readiness_path != health.liveness_path
    assert (check["interval"], check["timeout"]) == (health.interval_s, health.timeout_s)
    assert (check["healthyThreshold"], check["unhealthyThreshold"]) == (
        health.healthy_threshold,
        health.unhealthy_threshold,
    )
    assert check["port"] == "traffic-port" and check["matcher"] == "200"


def test_targets_serve_on_their_tls_port_drain_for_the_rollout_delay_and_warm_up(graph):
    tg = graph.one(TG).inputs
    assert tg["port"] == TARGET_TLS_PORT and tg["targetType"] == "instance"
    assert tg["deregistrationDelay"] == graph.settings.rollout.deregistration_delay_s
    assert 30 <= tg["slowStart"] <= 900
    assert tg["vpcId"] == graph.outputs["vpc_id"]


def test_waf_rate_limits_clients_when_the_stack_sets_a_limit(graph):
    limit = graph.settings.edge.waf_rate_limit
    acls = graph.of_type("aws:wafv2/webAcl:WebAcl")
    if not limit:
        assert not acls and not graph.of_type("aws:wafv2/webAclAssociation:WebAclAssociation")
        return
    [acl] = acls
    [rule] = acl.inputs["rules"]
    assert rule["statement"]["rateBasedStatement"]["limit"] == limit
    assert rule["statement"]["rateBasedStatement"]["aggregateKeyType"] == "IP"
    assert rule["action"] == {"block": {}}
    association = graph.one("aws:wafv2/webAclAssociation:WebAclAssociation").inputs
    assert association == {"resourceArn": graph.one(LB).outputs["arn"], "webAclArn": acl.outputs["arn"]}


def test_only_production_sets_a_waf_limit_in_these_stacks(dev, staging, prod):
    assert [len(g.of_type("aws:wafv2/webAcl:WebAcl")) for g in (dev, staging, prod)] == [0, 0, 1]
