"""``fab loadtest`` refuses bad options with a message naming the option and what is allowed."""

from __future__ import annotations

import pytest
from invoke import Context
from invoke.exceptions import Exit

from frontier.tasks.local_tasks import loadtest


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"step": "1,x"}, "--step '1,x': expected comma-separated rates"),
        ({"step": "2,0"}, "--step '2,0': every rate must be > 0"),
        ({"rate": 1, "concurrency": 2}, "give one of --rate, --step or --concurrency"),
        ({"endpoint": "embeddings"}, "--endpoint 'embeddings': must be 'completions' or 'chat'"),
        ({"replicas": 0}, "--replicas 0: must be >= 1"),
    ],
)
def test_bad_options_exit_2_naming_the_option(options, message):
    with pytest.raises(Exit) as exit_:
        loadtest(Context(), stack="local", url="http://127.0.0.1:9", **options)
    assert exit_.value.code == 2
    assert message in str(exit_.value.message)


def test_a_cloud_stack_needs_the_balancer_url():
    with pytest.raises(Exit) as exit_:
        loadtest(Context(), stack="prod", rate=1)
    assert "give --url" in str(exit_.value.message)
