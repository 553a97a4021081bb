"""Problems AWS would report halfway through an update, reported before anything is created.

Both programs (:mod:`infra.ec2_program`, :mod:`infra.kubernetes_program`) check their own target's
limits and share the checks here: the load balancer's certificate, the registry the runtime is
pulled from, and the one report that names every problem at once with its field path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from frontier.config.schema import Settings
from infra.cloud import Cloud
from infra.errors import ProvisionError
from infra.storage import bucket_suffix


def refuse_problems(settings: Settings, problems: Iterable[str]) -> None:
    """Raise one :class:`ProvisionError` listing every problem, if there is any."""
    found = list(problems)
    if found:
        lines = [f"{settings.source}: {len(found)} problem(s) for provisioning stack {settings.stack!r}"]
        raise ProvisionError("\n".join([*lines, *(f"  {p}" for p in found)]))


def certificate_problems(s: Settings, cloud: Cloud) -> Iterator[str]:
    """An ALB takes an ACM certificate of its own region only."""
    cert_region = s.edge.certificate_arn.split(":")[3] if s.edge.certificate_arn.count(":") >= 5 else ""
    if cert_region != cloud.region:
        yield (
            f"edge.certificate_arn = {s.edge.certificate_arn!r}: an ALB needs an ACM certificate of its own "
            f"region ({cloud.region})"
        )


def registry_problems(s: Settings, cloud: Cloud, pullers: str) -> Iterator[str]:
    """The runtime's image must come from the ECR repository the stack creates, which ``pullers``
    (the hosts, the nodes) are allowed to read."""
    registry = f"{cloud.account_id}.dkr.ecr.{cloud.region}.{cloud.dns_suffix}"
    host, _, path = s.image_repository.partition("/")
    if host != registry or not path:
        yield (
            f"runtime.image_repository = {s.image_repository!r}: {pullers} pull the runtime from the ECR "
            f"repository this stack creates; expected {registry}/<name>"
        )


def weights_bucket_problems(s: Settings, cloud: Cloud) -> Iterator[str]:
    """The weights bucket the stack creates takes a name no other account or region can hold."""
    weights_bucket = s.weights_root.removeprefix("s3://").split("/", 1)[0]
    if not weights_bucket.endswith(bucket_suffix(cloud)):
        yield (
            f"model.weights_uri = {s.weights_root!r}: S3 bucket names are global; name the weights "
            f"bucket with this account and region, e.g. frontier-{s.stack}-weights{bucket_suffix(cloud)}"
        )
