"""``runtime.kv_transfer`` (prefill/decode disaggregation) from the stack file to the engine: the
toolkit's runtime section is the runtime's own model, so a role written in a stack reaches
``runtime.yaml`` and the engine's config as written, and a bad one is refused at load time naming
the field, the value and what is allowed."""

from __future__ import annotations

import pytest
from frontier_runtime.config import parse_config
from frontier_runtime.engine.config import EngineConfig

from frontier.errors import StackError
from frontier.render.host import render_runtime_config
from frontier.targets import load_stack


def test_a_role_written_in_the_stack_reaches_runtime_yaml_and_the_engine(changed_stack, tmp_path) -> None:
    path = changed_stack(
        "local",
        {"runtime.kv_transfer": {"role": "prefill", "port": 5601, "lease_s": 30.0, "on_failure": "fail"}},
    )
    settings = load_stack("local", path=path)
    config = parse_config(render_runtime_config(settings, settings.only_pool))
    assert config.kv_transfer.role == "prefill" and config.kv_transfer.port == 5601
    engine = EngineConfig.from_runtime(config, tmp_path)
    assert (engine.kv_transfer.role, engine.kv_transfer.lease_s, engine.kv_transfer.on_failure) == (
        "prefill",
        30.0,
        "fail",
    )


def test_an_unknown_role_is_refused_at_load_time_naming_the_field(changed_stack) -> None:
    with pytest.raises(StackError, match=r"runtime\.kv_transfer\.role.*'router'"):
        load_stack("local", path=changed_stack("local", {"runtime.kv_transfer": {"role": "router"}}))


def test_a_decode_role_without_prefix_caching_is_refused_at_load_time(changed_stack) -> None:
    path = changed_stack(
        "local", {"runtime.kv_transfer": {"role": "decode"}, "runtime.prefix_caching": False}
    )
    with pytest.raises(
        StackError, match="prefix_caching = False: must be true when kv_transfer.role is 'decode'"
    ):
        load_stack("local", path=path)
