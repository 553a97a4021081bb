"""A disaggregated pool's gateway settings: refused with the field and the value when wrong."""

from __future__ import annotations

import pytest
from frontier_gateway.config import DisaggregationRouting, PoolConfig
from pydantic import ValidationError

P, D, C = "http://10.0.1.7:8000", "http://10.0.1.8:8000", "http://10.0.1.9:8000"


def test_a_pool_of_prefill_and_decode_replicas_needs_no_colocated_replica() -> None:
    pool = PoolConfig(name="m", disaggregation={"prefill": [P], "decode": [D]})
    assert pool.replicas == () and pool.disaggregation == DisaggregationRouting(prefill=(P,), decode=(D,))


def test_a_replica_listed_in_both_roles_is_refused_naming_it() -> None:
    with pytest.raises(
        ValidationError, match=r"\['http://10.0.1.7:8000'\] listed as both prefill and decode"
    ):
        DisaggregationRouting(prefill=[P], decode=[P, D])


def test_a_role_url_with_a_path_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError, match="'http://10.0.1.8:8000/v1' must be a base URL"):
        PoolConfig(name="m", replicas=[C], disaggregation={"prefill": [P], "decode": [D + "/v1"]})


def test_a_disaggregated_pool_needs_both_roles() -> None:
    with pytest.raises(ValidationError, match="disaggregation.decode"):
        PoolConfig(name="m", replicas=[C], disaggregation={"prefill": [P], "decode": []})
