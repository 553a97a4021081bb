"""``capacity.input_length_edges``: where a load test splits its requests by prompt length, checked
as the stack loads."""

from __future__ import annotations

import pytest

from frontier.errors import StackError
from frontier.targets import load_stack

BAD_EDGES = [
    ([1024, 256], "[1024, 256]: the edges must increase strictly"),
    ([256, 256], "[256, 256]: the edges must increase strictly"),
    ([1, 256], "every edge must be 2..1048576 tokens, not 1"),
    ([256, 2_000_000], "every edge must be 2..1048576 tokens, not 2000000"),
]


@pytest.mark.parametrize(("edges", "allowed"), BAD_EDGES, ids=[str(e) for e, _ in BAD_EDGES])
def test_edges_out_of_range_are_refused_at_load_naming_field_value_and_rule(changed_stack, edges, allowed):
    path = changed_stack("local", {"capacity.input_length_edges": edges})
    with pytest.raises(StackError) as err:
        load_stack("local", path=path)
    assert "capacity.input_length_edges" in str(err.value) and allowed in str(err.value)


def test_a_stack_that_sets_none_splits_at_256_1k_and_4k():
    assert load_stack("local").capacity.input_length_edges == (256, 1024, 4096)
