"""The official `openai` Python client against the server: completions, chat, streaming, models, errors."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")

MESSAGES = [{"role": "user", "content": "Say something."}]


def test_models(api):
    assert [m.id for m in api.models.list()] == ["llama"]
    assert api.models.retrieve("llama").id == "llama"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4o")


def test_completion(api, gen):
    reply = api.completions.create(
        model="llama", prompt="The quick brown fox", max_tokens=10, temperature=0, seed=7, user="u1"
    )
    result = gen.generate("The quick brown fox", 10)
    assert reply.choices[0].text == result.text and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == len(result.ids) and reply.usage.prompt_tokens == result.stats.prompt_tokens
    assert reply.model_extra["jacobi"]["tokens_per_pass"] >= 1.0


def test_chat_and_extension_field(api, gen):
    reply = api.chat.completions.create(
        model="llama", messages=MESSAGES, max_tokens=10, extra_body={"jacobi": {"strategy": "jacobi", "window": 4}}
    )
    assert reply.choices[0].message.content == gen.generate(messages=MESSAGES, max_new_tokens=10).text
    assert reply.choices[0].message.role == "assistant"
    assert reply.model_extra["jacobi"]["strategy"] == "jacobi" and reply.model_extra["jacobi"]["window"] == 4


def test_streamed_chat_with_usage(api, gen):
    chunks = list(
        api.chat.completions.create(
            model="llama", messages=MESSAGES, max_tokens=10, stream=True, stream_options={"include_usage": True}
        )
    )
    result = gen.generate(messages=MESSAGES, max_new_tokens=10)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == result.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == len(result.ids) and chunks[-1].choices == []


def test_streamed_completion(api, gen):
    chunks = list(api.completions.create(model="llama", prompt="Once upon a time", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == gen.generate("Once upon a time", 10).text


def test_errors_are_typed_exceptions(api):
    with pytest.raises(openai.BadRequestError, match="temperature must be 0 \\(greedy\\) or a number >= 1e-05"):
        api.chat.completions.create(model="llama", messages=MESSAGES, temperature=-0.7)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="context") as caught:
        api.completions.create(model="llama", prompt="hi", max_tokens=100_000)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "max_tokens"


def test_api_key(start_server):
    server = start_server(api_key="s3cret")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError, match="API key"):
            bad.models.list()
    with openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0) as good:
        assert good.completions.create(model="llama", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
