"""A small Kubernetes API server over a real socket, for the handful of endpoints the rollout uses.

What is real: the ``kubernetes`` client library, its kubeconfig loading, its HTTP requests and
error handling, over TCP to this server. What is mocked: the API server and the controllers
behind it. This server keeps Deployments, ConfigMaps and Pods in memory and plays the Deployment
controller in the simplest way: a changed pod template replaces that Deployment's pods at once,
and the status reports them updated and available after ``settle_reads`` further reads. Each pod
serves ``/metrics`` through the pod proxy path, counting requests as a runtime would; what an image
does is chosen per digest (``behaviour``): ``good`` answers 200s, ``errors`` answers 500s,
``slow`` answers 200s ten times slower (its latency histogram's requests all over a second),
``stuck`` never becomes available and reports ``ProgressDeadlineExceeded``; ``owner_behaviour``
names a Deployment whose pods' metrics behave so whatever their image.

``pods/portforward`` speaks the API server's WebSocket port-forward protocol (v4.channel.k8s.io,
as the client library's ``portforward`` does): each stream is joined to the TCP address ``forwards``
names for the pod's image, a real server of the test's (none: the stream's error channel says so).

Endpoints: GET/PATCH(json-patch)/DELETE ``/apis/apps/v1/namespaces/{ns}/deployments/{name}``,
POST ``/apis/apps/v1/namespaces/{ns}/deployments``, POST/GET ``/api/v1/namespaces/{ns}/configmaps``,
DELETE ``/api/v1/namespaces/{ns}/configmaps/{name}``,
GET ``/api/v1/namespaces/{ns}/pods?labelSelector=``, GET
``/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics``, GET (WebSocket)
``/api/v1/namespaces/{ns}/pods/{pod}/portforward?ports=``, PATCH (json-patch, condition appends)
``/api/v1/namespaces/{ns}/pods/{pod}/status`` (a pod with readiness gates is Ready, and counts as
available, only once each gate's condition is True), GET/PATCH(json-patch)
``/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}``, GET
``/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io/service-name=``
(one slice per Service in ``services``, its endpoints the selected pods, ready as they are), PATCH
(merge patch) ``/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/{name}``. Anything else
answers 404.

A Deployment whose replicas change and whose template does not keeps its pods, adds or removes the
difference (the newest first), as a ReplicaSet scales; ``timeline`` holds every Deployment's
replicas, each Service's ready endpoints and whether each ScaledObject is paused, after each write.

With ``rules`` (the deploy Role's, ``frontier.targets.kubernetes.deploy_access``) the server
authorizes as RBAC does: each request resolved to a verb on an API group's resource (subresource
included), refused with 403 Forbidden unless a rule allows it, and recorded in ``authorized``.

LeaderWorkerSets get the LWS controller, as simply: changed templates replace every group's pods
(a leader ``<name>-<group>`` with worker index 0, workers ``<name>-<group>-<index>``) at once, and
the status reports every group updated and ready after ``settle_reads`` further reads; a ``stuck``
image's groups never become ready (LWS reports no progress deadline: the rollout's clock runs out).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import re
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from frontier_hostside import names

from frontier.targets.kubernetes.deploy_access import Rule

DEPLOYMENT = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments(?:/([^/]+))?$")
CONFIG_MAPS = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
PROXY = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+):(\d+)/proxy/metrics$")
PORT_FORWARD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+)/portforward$")
POD_STATUS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+)/status$")
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ENDPOINT_SLICES = re.compile(r"^/apis/discovery.k8s.io/v1/namespaces/([^/]+)/endpointslices$")
SCALED_OBJECTS = re.compile(r"^/apis/keda.sh/v1alpha1/namespaces/([^/]+)/scaledobjects/([^/]+)$")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
KEDA_PAUSED = "autoscaling.keda.sh/paused"
GROUPS = re.compile(r"^/apis/leaderworkerset.x-k8s.io/v1/namespaces/([^/]+)/leaderworkersets/([^/]+)$")
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
ROUTE = "/v1/chat/completions"
REQUESTS_PER_SCRAPE = 100


RESOURCE_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/[^/]+/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?"
)
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update"}


def request_attributes(method: str, path: str, query: str = "") -> tuple[str, str, str]:
    """The verb, API group and resource RBAC authorizes a request as (the API server's request info:
    a GET of a name is get, of a collection list or watch; a subresource joins its resource)."""
    match = RESOURCE_PATH.match(path)
    if match is None:
        return method.lower(), "", path
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    if match["resource"] == "pods" and match["name"] and ":" in match["name"] and match["sub"] == "proxy":
        resource = "pods/proxy"  # pods/{name}:{port}/proxy/...
    named = match["name"] is not None
    if method == "GET":
        verb = "get" if named else ("watch" if "watch=true" in query else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = VERBS[method]
    return verb, match["group"] or "", resource


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _ready(pod: dict) -> bool:
    return pod["status"]["conditions"][0]["status"] == "True"


def _pointer_set(document: dict, path: str, value: Any) -> None:
    steps = [s.replace("~1", "/").replace("~0", "~") for s in path.lstrip("/").split("/")]
    target = document
    for step in steps[:-1]:
        target = target[step]
    target[steps[-1]] = value


@dataclass
class FakeCluster:
    namespace: str
    behaviour: Callable[[str], str] = lambda image: "good"
    settle_reads: int = 1
    deployments: dict[str, dict] = field(default_factory=dict)
    config_maps: dict[str, dict] = field(default_factory=dict)
    pods: dict[str, dict] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    scrapes: dict[str, int] = field(default_factory=dict)
    groups: dict[str, dict] = field(default_factory=dict)
    #: The Role the caller is bound to (None: every request allowed, as for a cluster admin).
    rules: tuple[Rule, ...] | None = None
    #: Every request as RBAC saw it: (verb, API group, resource), allowed or not.
    authorized: list[tuple[str, str, str, bool]] = field(default_factory=list)
    #: Where a port-forward to a pod of this image (and port) is joined: a real server's address.
    forwards: Callable[[str, int], tuple[str, int] | None] = lambda image, port: None
    #: What the pods of a named Deployment do whatever their image (``errors``...): one half of a
    #: pair failing on a release the other half serves.
    owner_behaviour: dict[str, str] = field(default_factory=dict)
    #: Each Service's pod selector, by name: its EndpointSlice lists the pods it selects.
    services: dict[str, dict[str, str]] = field(default_factory=dict)
    scaled_objects: dict[str, dict] = field(default_factory=dict)
    #: After each write to a Deployment or ScaledObject: every Deployment's replicas
    #: (``<name>``), each Service's ready endpoints (``service/<name>``) and whether each
    #: ScaledObject is paused (``paused/<name>``: 1 or 0).
    timeline: list[dict[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: dict[str, int] = field(default_factory=dict)

    # --- the Deployment controller, simplified ------------------------------------------------------

    def put_deployment(self, body: dict) -> dict:
        return self._put(body, self.deployments, self._replace_pods)

    def _put(self, body: dict, store: dict[str, dict], replace_pods: Callable[[dict], None]) -> dict:
        """A new generation of a workload: its pods replaced, its status observed ``settle_reads``
        reads later."""
        name = body["metadata"]["name"]
        live = copy.deepcopy(body)
        live["metadata"].setdefault("generation", 0)
        live["metadata"]["generation"] += 1
        live["spec"].setdefault("replicas", 1)
        store[name] = live
        replace_pods(live)
        self._pending[name] = self.settle_reads
        live["status"] = {
            "observedGeneration": live["metadata"]["generation"] - 1,
            "replicas": live["spec"]["replicas"],
        }
        return live

    def _image(self, deployment: dict) -> str:
        return deployment["spec"]["template"]["spec"]["containers"][0]["image"]

    def _replace_pods(self, deployment: dict) -> None:
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        template_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        prefix = f"{name}-{template_hash}-"
        owned = [p for p, v in self.pods.items() if v["owner"] == name]
        if any(not p.startswith(prefix) for p in owned):  # a new template: every pod replaced
            for pod in owned:
                del self.pods[pod]
            owned = []
        want = deployment["spec"]["replicas"]
        for pod in sorted(owned, key=lambda p: int(p.rsplit("-", 1)[1]))[want:]:
            del self.pods[pod]  # scaled in: the newest pods go
        taken = {int(p.rsplit("-", 1)[1]) for p in owned}
        free = (i for i in range(want + len(taken)) if i not in taken)
        for _ in range(max(0, want - len(owned))):
            self._add_pod(f"{prefix}{next(free)}", name, template, {})
        self._record()

    def _record(self) -> None:
        moment = {name: d["spec"]["replicas"] for name, d in self.deployments.items()}
        moment.update({f"service/{name}": len(self.ready_endpoints(name)) for name in self.services})
        # KEDA leaves a paused ScaledObject's target alone (autoscaling.keda.sh/paused).
        moment.update(
            {
                f"paused/{name}": int((o["metadata"].get("annotations") or {}).get(KEDA_PAUSED) == "true")
                for name, o in self.scaled_objects.items()
            }
        )
        self.timeline.append(moment)

    def ready_endpoints(self, service: str) -> list[dict]:
        """The Service's endpoints as the EndpointSlice controller lists them: one per selected pod."""
        wanted = self.services[service]
        return [
            {
                "addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": pod["status"]["conditions"][0]["status"] == "True"},
                "targetRef": {"kind": "Pod", "name": name, "namespace": self.namespace},
            }
            for name, pod in sorted(self.pods.items())
            if all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())
            and pod["status"]["conditions"][0]["status"] == "True"
        ]

    def read_deployment(self, name: str) -> dict | None:
        live = self.deployments.get(name)
        if live is None:
            return None
        behaviour = self.behaviour(self._image(live))
        replicas = live["spec"]["replicas"]
        if behaviour == "stuck":
            live["status"] = {
                "observedGeneration": live["metadata"]["generation"],
                "replicas": replicas + 1,
                "updatedReplicas": 1,
                "availableReplicas": replicas - 1 if replicas > 1 else 0,
                "conditions": [
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "ProgressDeadlineExceeded",
                        "message": f'ReplicaSet "{name}" has timed out progressing.',
                    }
                ],
            }
        elif self._pending.get(name, 0) > 0:
            self._pending[name] -= 1
        else:
            # A pod held by a readiness gate whose condition is not set yet is not Ready, so not
            # available: the Deployment waits on it as the controller would.
            ready = sum(1 for pod in self.pods.values() if pod["owner"] == name and _ready(pod))
            live["status"] = {
                "observedGeneration": live["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "conditions": [
                    {"type": "Available", "status": "True" if ready >= replicas else "False"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                ],
            }
        return live

    def set_pod_condition(self, pod: str, condition: dict) -> None:
        """A condition written to ``pod``'s status: a readiness gate's, once True, makes the pod
        Ready where its containers are (and so one of its Services' endpoints)."""
        record = self.pods[pod]
        conditions = [c for c in record["status"]["conditions"] if c["type"] != condition["type"]]
        record["status"]["conditions"] = [*conditions, condition]
        gates_set = all(
            any(c["type"] == gate and c["status"] == "True" for c in record["status"]["conditions"])
            for gate in record["gates"]
        )
        containers = record["status"]["conditions"][1]["status"] == "True"
        record["status"]["conditions"][0]["status"] = "True" if containers and gates_set else "False"
        self._record()

    # --- the LeaderWorkerSet controller, simplified ----------------------------------------------

    def put_group(self, body: dict) -> dict:
        return self._put(body, self.groups, self._replace_group_pods)

    def _replace_group_pods(self, group: dict) -> None:
        name = group["metadata"]["name"]
        for pod in [p for p, v in self.pods.items() if v["owner"] == name]:
            del self.pods[pod]
        spec = group["spec"]["leaderWorkerTemplate"]
        for g in range(group["spec"]["replicas"]):
            for index in range(spec["size"]):
                template = spec["leaderTemplate" if index == 0 else "workerTemplate"]
                pod = f"{name}-{g}" if index == 0 else f"{name}-{g}-{index}"
                self._add_pod(pod, name, template, {WORKER_INDEX: str(index)})

    def _add_pod(self, pod: str, owner: str, template: dict, labels: dict[str, str]) -> None:
        image = template["spec"]["containers"][0]["image"]
        up = self.behaviour(image) != "stuck"
        gates = [g["conditionType"] for g in template["spec"].get("readinessGates") or []]
        self.pods[pod] = {
            "owner": owner,
            "image": image,
            "gates": gates,
            "metadata": {
                "name": pod,
                "namespace": self.namespace,
                "labels": {**(template["metadata"].get("labels") or {}), **labels},
                "annotations": dict(template["metadata"].get("annotations") or {}),
            },
            "spec": {"nodeName": f"ip-10-50-0-{len(self.pods) + 10}.ec2.internal"},
            "status": {
                "phase": "Running" if up else "Pending",
                "podIP": f"10.50.1.{len(self.pods) + 10}",
                # Ready first (the endpoints read it), then ContainersReady.
                "conditions": [
                    {"type": "Ready", "status": "True" if up and not gates else "False"},
                    {"type": "ContainersReady", "status": "True" if up else "False"},
                ],
                "containerStatuses": [
                    {"image": image, "imageID": image, "state": {"running": {}} if up else {"waiting": {}}}
                ],
            },
        }

    def read_group(self, name: str) -> dict | None:
        live = self.groups.get(name)
        if live is None:
            return None
        leader = live["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        replicas = live["spec"]["replicas"]
        if self.behaviour(leader["spec"]["containers"][0]["image"]) == "stuck":
            live["status"] = {
                "observedGeneration": live["metadata"]["generation"],
                "replicas": replicas + 1,
                "updatedReplicas": 1,
                "readyReplicas": replicas - 1 if replicas > 1 else 0,
                "conditions": [{"type": "UpdateInProgress", "status": "True"}],
            }
        elif self._pending.get(name, 0) > 0:
            self._pending[name] -= 1
        else:
            live["status"] = {
                "observedGeneration": live["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "conditions": [{"type": "Available", "status": "True"}],
            }
        return live

    # --- a runtime's /metrics ---------------------------------------------------------------------

    def metrics(self, pod: str) -> str:
        count = self.scrapes.get(pod, 0) + 1
        self.scrapes[pod] = count
        owner, image = self.pods[pod]["owner"], self.pods[pod]["image"]
        behaviour = self.owner_behaviour.get(owner) or self.behaviour(image)
        errors = behaviour == "errors"
        served = count * REQUESTS_PER_SCRAPE
        failed = served // 4 if errors else 0
        requests, duration = names.HTTP_REQUESTS_METRIC, names.HTTP_DURATION_METRIC
        lines = [
            f"# TYPE {requests} counter",
            f'{requests}_total{{route="{ROUTE}",status="200"}} {served - failed}',
            f'{requests}_total{{route="{ROUTE}",status="500"}} {failed}',
            f'{requests}_total{{route="/health/ready",status="200"}} {count * 7}',
            f"# TYPE {duration} histogram",
        ]
        slow = behaviour == "slow"
        for le in ("0.5", "1.0", "5.0", "+Inf"):
            within = 0 if slow and le in ("0.5", "1.0") else served
            lines.append(f'{duration}_bucket{{route="{ROUTE}",le="{le}"}} {within}')
        lines += [
            f'{duration}_count{{route="{ROUTE}"}} {served}',
            f'{duration}_sum{{route="{ROUTE}"}} {served * (2.0 if slow else 0.2)}',
        ]
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        url = url._replace(path=unquote(url.path))  # as the API server reads it (pod:port arrives as %3A)
        cluster = self.cluster
        if not self._authorized(method, url.path, url.query):
            return None
        if (match := PORT_FORWARD.match(url.path)) and method == "GET":
            with cluster.lock:
                cluster.requests.append((method, url.path))
                pod = cluster.pods.get(match.group(2))
            port = int(parse_qs(url.query).get("ports", ["0"])[0])
            if pod is None:
                return self._send(404, _status(404, "NotFound", f'pods "{match.group(2)}" not found'))
            return self._port_forward(cluster.forwards(pod["image"], port), port)
        with cluster.lock:
            cluster.requests.append((method, url.path))
            if match := DEPLOYMENT.match(url.path):
                return self._deployment(method, match.group(2))
            if match := GROUPS.match(url.path):
                return self._group(method, match.group(2))
            if ENDPOINT_SLICES.match(url.path) and method == "GET":
                return self._endpoint_slices(url.query)
            if match := SCALED_OBJECTS.match(url.path):
                return self._scaled_object(method, match.group(2))
            if match := CONFIG_MAPS.match(url.path):
                return self._config_map(method, match.group(2), url.query)
            if PODS.match(url.path) and method == "GET":
                wanted = dict(
                    pair.split("=", 1)
                    for pair in parse_qs(url.query).get("labelSelector", [""])[0].split(",")
                    if pair
                )
                items = [
                    {key: pod[key] for key in ("metadata", "spec", "status")}
                    for pod in cluster.pods.values()
                    if all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())
                ]
                return self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
            if (match := POD_STATUS.match(url.path)) and method == "PATCH":
                return self._pod_status(match.group(2))
            if (match := PROXY.match(url.path)) and method == "GET":
                pod = match.group(2)
                if pod not in cluster.pods:
                    return self._send(404, _status(404, "NotFound", f'pods "{pod}" not found'))
                return self._send(200, cluster.metrics(pod), "text/plain; version=0.0.4")
            return self._send(404, _status(404, "NotFound", f"{method} {url.path}"))

    def _authorized(self, method: str, path: str, query: str) -> bool:
        verb, group, resource = request_attributes(method, path, query)
        rules = self.cluster.rules
        allowed = rules is None or any(rule.allows(verb, group, resource) for rule in rules)
        with self.cluster.lock:
            self.cluster.authorized.append((verb, group, resource, allowed))
        if not allowed:
            self._send(
                403,
                _status(
                    403,
                    "Forbidden",
                    f'{resource} is forbidden: User "deploy" cannot {verb} resource "{resource}" in API group '
                    f'"{group}" in the namespace "{self.cluster.namespace}"',
                ),
            )
        return allowed

    def _config_map(self, method: str, name: str | None, query: str) -> None:
        cluster = self.cluster
        if method == "POST" and name is None:
            body = self._body()
            name = body["metadata"]["name"]
            if name in cluster.config_maps:
                return self._send(409, _status(409, "AlreadyExists", f'configmaps "{name}" already exists'))
            # Creation order, as the API server's timestamps would give it.
            body["metadata"]["creationTimestamp"] = f"2026-12-03T09:{len(cluster.config_maps):02d}:00Z"
            cluster.config_maps[name] = body
            return self._send(201, body)
        if method == "GET" and name is None:
            wanted = dict(
                p.split("=", 1) for p in parse_qs(query).get("labelSelector", [""])[0].split(",") if p
            )
            items = [
                c
                for c in cluster.config_maps.values()
                if all((c["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
            ]
            return self._send(200, {"kind": "ConfigMapList", "apiVersion": "v1", "items": items})
        if method == "DELETE" and name in cluster.config_maps:
            del cluster.config_maps[name]
            return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return self._send(404, _status(404, "NotFound", f'configmaps "{name}" not found'))

    def _endpoint_slices(self, query: str) -> None:
        wanted = dict(p.split("=", 1) for p in parse_qs(query).get("labelSelector", [""])[0].split(",") if p)
        service = wanted.get(SERVICE_NAME_LABEL)
        items = []
        if service in self.cluster.services:
            items.append(
                {
                    "metadata": {"name": f"{service}-abcde", "labels": {SERVICE_NAME_LABEL: service}},
                    "addressType": "IPv4",
                    "endpoints": self.cluster.ready_endpoints(service),
                }
            )
        return self._send(
            200, {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "items": items}
        )

    def _scaled_object(self, method: str, name: str) -> None:
        live = self.cluster.scaled_objects.get(name)
        if live is None:
            return self._send(404, _status(404, "NotFound", f'scaledobjects.keda.sh "{name}" not found'))
        if method != "PATCH":
            return self._send(405, _status(405, "MethodNotAllowed", method))
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self._send(415, _status(415, "UnsupportedMediaType", self.headers.get("Content-Type", "")))
        annotations = live["metadata"].setdefault("annotations", {})
        for key, value in (self._body().get("metadata", {}).get("annotations") or {}).items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        self.cluster._record()
        return self._send(200, live)

    def _deployment(self, method: str, name: str | None) -> None:
        cluster = self.cluster
        if method == "POST" and name is None:
            body = self._body()
            if body["metadata"]["name"] in cluster.deployments:
                return self._send(409, _status(409, "AlreadyExists", "deployment exists"))
            return self._send(201, cluster.put_deployment(body))
        live = cluster.read_deployment(name) if name else None
        if live is None:
            return self._send(404, _status(404, "NotFound", f'deployments.apps "{name}" not found'))
        if method == "GET":
            return self._send(200, live)
        if method == "DELETE":
            del cluster.deployments[name]
            for pod in [p for p, v in cluster.pods.items() if v["owner"] == name]:
                del cluster.pods[pod]
            cluster._record()
            return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if method == "PATCH":
            updated = self._patched(live)
            return None if updated is None else self._send(200, cluster.put_deployment(updated))
        return self._send(405, _status(405, "MethodNotAllowed", method))

    def _patched(self, live: dict) -> dict | None:
        """``live`` with the request's JSON patch applied (replace and add only); None once an error
        answer is sent."""
        if self.headers.get("Content-Type") != "application/json-patch+json":
            self._send(415, _status(415, "UnsupportedMediaType", self.headers.get("Content-Type", "")))
            return None
        updated = copy.deepcopy(live)
        for op in self._body():
            if op["op"] not in ("replace", "add"):
                self._send(422, _status(422, "Invalid", f"op {op['op']}"))
                return None
            _pointer_set(updated, op["path"], op["value"])
        return updated

    def _pod_status(self, pod: str) -> None:
        """A JSON patch that appends conditions to a pod's status (what a readiness gate's
        controller writes); anything else in it is refused."""
        if pod not in self.cluster.pods:
            return self._send(404, _status(404, "NotFound", f'pods "{pod}" not found'))
        if self.headers.get("Content-Type") != "application/json-patch+json":
            return self._send(415, _status(415, "UnsupportedMediaType", self.headers.get("Content-Type", "")))
        ops = self._body()
        if any(op["op"] != "add" or op["path"] != "/status/conditions/-" for op in ops):
            return self._send(422, _status(422, "Invalid", f"only condition appends: {ops}"))
        for op in ops:
            self.cluster.set_pod_condition(pod, op["value"])
        record = self.cluster.pods[pod]
        return self._send(200, {key: record[key] for key in ("metadata", "spec", "status")})

    def _group(self, method: str, name: str) -> None:
        cluster = self.cluster
        live = cluster.read_group(name)
        if live is None:
            return self._send(
                404, _status(404, "NotFound", f'leaderworkersets.leaderworkerset.x-k8s.io "{name}" not found')
            )
        if method == "GET":
            return self._send(200, live)
        if method == "PATCH":
            updated = self._patched(live)
            return None if updated is None else self._send(200, cluster.put_group(updated))
        return self._send(405, _status(405, "MethodNotAllowed", method))

    # --- pods/portforward over a WebSocket -------------------------------------------------------

    def _port_forward(self, target: tuple[str, int] | None, port: int) -> None:
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        ws = self.connection
        number = port.to_bytes(2, "little")
        _frame(ws, b"\x00" + number)  # each channel's first frame: the port it carries
        _frame(ws, b"\x01" + number)
        if target is None:
            _frame(ws, b"\x01" + f"nothing listens on port {port}".encode())
            _frame(ws, b"", opcode=0x8)
            return
        backend = socket.create_connection(target)
        try:
            while True:
                readable, _, _ = select.select([ws, backend], [], [], 30)
                if not readable:
                    break
                if backend in readable:
                    data = backend.recv(65536)
                    if not data:
                        break
                    _frame(ws, b"\x00" + data)
                if ws in readable:
                    opcode, payload = _read_frame(ws)
                    if opcode == 0x8 or opcode is None:
                        break
                    if opcode == 0x2 and payload[:1] == b"\x00" and len(payload) > 1:
                        backend.sendall(payload[1:])
        finally:
            backend.close()
            with contextlib.suppress(OSError):
                _frame(ws, b"", opcode=0x8)

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")


def _frame(sock: socket.socket, payload: bytes, opcode: int = 0x2) -> None:
    """One unmasked WebSocket frame (a server's), FIN set."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    sock.sendall(head + payload)


def _read_frame(sock: socket.socket) -> tuple[int | None, bytes]:
    """One WebSocket frame from a client (masked): its opcode and payload; (None, b"") at the end."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    try:
        first, second = exactly(2)
        n = second & 0x7F
        if n == 126:
            n = int.from_bytes(exactly(2), "big")
        elif n == 127:
            n = int.from_bytes(exactly(8), "big")
        mask = exactly(4) if second & 0x80 else b"\x00\x00\x00\x00"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(exactly(n)))
    except (ConnectionError, OSError):
        return None, b""
    return first & 0x0F, payload


class FakeApiServer:
    def __init__(self, cluster: FakeCluster) -> None:
        handler = type("Handler", (_Handler,), {"cluster": cluster})
        self.cluster = cluster
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, context: str) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                "contexts": [{"name": context, "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": context,
            }
        )
