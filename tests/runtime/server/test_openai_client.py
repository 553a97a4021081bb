"""The official ``openai`` client against the runtime on a real socket."""

from __future__ import annotations

import openai
import pytest
from server_harness import MODEL


@pytest.fixture(scope="module")
def client(shared_server):
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def test_completion_returns_text_and_usage(client: openai.OpenAI, codec) -> None:
    result = client.completions.create(
        model=MODEL, prompt="the model", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    choice = result.choices[0]
    assert choice.finish_reason == "length"
    assert choice.text
    prompt_tokens = len(codec.encode("the model"))
    assert result.usage.prompt_tokens == prompt_tokens
    assert result.usage.completion_tokens == 5
    assert result.usage.total_tokens == prompt_tokens + 5
    assert result.model == MODEL and result.id.startswith("cmpl-")


def test_greedy_completion_is_deterministic(client: openai.OpenAI) -> None:
    texts = {
        client.completions.create(model=MODEL, prompt="deploy the canary", max_tokens=8, temperature=0)
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sample() -> str:
        return (
            client.completions.create(model=MODEL, prompt="river", max_tokens=8, temperature=1.0, seed=7)
            .choices[0]
            .text
        )

    assert sample() == sample()


def test_chat_completion_uses_the_chat_template(client: openai.OpenAI, codec) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    result = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    expected_prompt = codec.encode(codec.render_chat(messages), add_special_tokens=False)
    assert result.usage.prompt_tokens == len(expected_prompt)
    assert result.id.startswith("chatcmpl-")


def test_streamed_completion_matches_the_unary_one_and_ends_with_usage(client: openai.OpenAI) -> None:
    args = {
        "model": MODEL,
        "prompt": "cluster node",
        "max_tokens": 12,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**args).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_streamed_chat_sends_role_then_deltas_then_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "tell me about the river"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True))
    assert all(c.choices for c in chunks)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_logprobs_come_back_in_openai_shape(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt="the", max_tokens=3, temperature=0, logprobs=2)
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 3
    assert all(len(top) <= 2 and top for top in lp.top_logprobs)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 2 and all(len(c.top_logprobs) <= 3 for c in content)


def test_context_overflow_is_a_400_naming_both_numbers(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hello there", max_tokens=10_000)
    body = err.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "max_tokens"
    assert "256" in body["message"] and "10000" in body["message"]


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-imaginary", prompt="x", max_tokens=1)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
