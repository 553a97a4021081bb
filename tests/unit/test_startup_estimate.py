"""A node group's instance warm-up: its setting where the stack gives one, else the estimate from the
weights of the pools on it at S3's rate per connection, scaled by the cold start's measured ratio."""

from __future__ import annotations

import math

import pytest

from frontier.capacity.startup import (
    COLD_START_RATIO,
    HOST_BOOT_S,
    S3_CONNECTION_BYTES_PER_S,
    instance_warmup,
)
from frontier.config.memory import weights_bytes
from frontier.config.schema import NodeGroup
from frontier.targets import load_stack


def test_unset_it_is_the_boot_plus_the_measured_ratio_over_the_weights_network_bound() -> None:
    settings = load_stack("prod")
    group = settings.serving_group
    pool = settings.only_pool
    bound = weights_bytes(pool.model) / (pool.runtime.weights_fetch_concurrency * S3_CONNECTION_BYTES_PER_S)
    estimate = instance_warmup(settings, group)
    assert estimate.source == "estimate"
    assert estimate.seconds == math.ceil(HOST_BOOT_S + COLD_START_RATIO * bound)


def test_more_connections_shorten_the_estimate() -> None:
    settings = load_stack("prod")
    wider = settings.model_copy(
        update={"runtime": settings.runtime.model_copy(update={"weights_fetch_concurrency": 32})}
    )
    assert (
        instance_warmup(wider, wider.serving_group).seconds
        < instance_warmup(settings, settings.serving_group).seconds
    )


def test_the_groups_setting_wins_over_the_estimate() -> None:
    settings = load_stack("prod")
    group = settings.serving_group.model_copy(update={"instance_warmup_s": 420})
    assert instance_warmup(settings, group).seconds == 420
    assert instance_warmup(settings, group).source == "setting"


def test_a_warmup_beyond_an_hour_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="instance_warmup_s"):
        NodeGroup.model_validate({**load_stack("prod").serving_group.model_dump(), "instance_warmup_s": 3601})
