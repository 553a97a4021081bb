"""An entry point (a task, the demo) chooses the pool it acts for once, as it loads the stack: the
one its ``--model`` names, or a one-model stack's only pool; a stack of several never answers with
its first."""

from __future__ import annotations

import pytest

from frontier.config.load import chosen_pool
from frontier.config.schema import Settings
from frontier.errors import StackError
from frontier.targets import load_stack


def two_models() -> Settings:
    prod = load_stack("prod")
    (own,) = prod.pools
    other = own.model_copy(update={"model": own.model.model_copy(update={"name": "other-model"})})
    return prod.model_copy(update={"pools": (own, other)})


def test_a_one_model_stack_acts_for_its_pool_unnamed():
    prod = load_stack("prod")
    assert chosen_pool(prod) is prod.pools[0]


def test_the_model_named_chooses_its_pool():
    assert chosen_pool(two_models(), "other-model").name == "other-model"


def test_a_stack_of_several_models_refuses_to_choose_naming_them():
    with pytest.raises(StackError) as err:
        chosen_pool(two_models())
    assert "serves 2 models (llama-3.1-70b-instruct, other-model): name the pool to act for" in str(err.value)


def test_a_model_the_stack_does_not_serve_is_refused_naming_those_it_does():
    with pytest.raises(StackError) as err:
        chosen_pool(two_models(), "nope")
    assert str(err.value).startswith("--model: model 'nope' is not served by stack 'prod': it serves ")
