"""Completions and chat over real HTTP, streamed and not: the text equals Generator.generate's."""

from __future__ import annotations

import pytest
from sse_client import stream, streamed_text

PROMPTS = ["The quick brown fox", "Once upon a time", "def fib(n):"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def check_usage(body: dict, result) -> None:
    assert body["usage"] == {
        "prompt_tokens": result.stats.prompt_tokens,
        "completion_tokens": len(result.ids),
        "total_tokens": result.stats.prompt_tokens + len(result.ids),
        "prompt_tokens_details": {"cached_tokens": body["usage"]["prompt_tokens_details"]["cached_tokens"]},
    }
    assert 0 <= body["usage"]["prompt_tokens_details"]["cached_tokens"] < result.stats.prompt_tokens


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_equals_generate(client, gen, prompt):
    body = client.post("/v1/completions", json={"model": "llama", "prompt": prompt, "max_tokens": 12}).json()
    result = gen.generate(prompt, 12, strategy="auto")
    assert body["object"] == "text_completion" and body["model"] == "llama"
    assert body["choices"][0]["text"] == result.text
    assert body["choices"][0]["finish_reason"] == (
        "length" if result.stats.finish_reason in ("length", "context") else "stop"
    )
    check_usage(body, result)
    assert body["jacobi"]["strategy"] == "auto" and body["jacobi"]["target_passes"] >= 1


@pytest.mark.parametrize("strategy, window", [("greedy", None), ("jacobi", 4), ("lookahead", None)])
def test_every_strategy_gives_greedy_text(client, gen, strategy, window):
    greedy = gen.generate(PROMPTS[0], 20, strategy="greedy")
    body = client.post(
        "/v1/completions",
        json={"prompt": PROMPTS[0], "max_tokens": 20, "jacobi": {"strategy": strategy, "window": window}},
    ).json()
    assert body["choices"][0]["text"] == greedy.text
    stats = body["jacobi"]
    assert stats["strategy"] == strategy and stats["tokens_per_pass"] >= 1.0
    assert stats["target_passes"] <= greedy.stats.target_passes


def test_the_jacobi_field_takes_decoding_config_fields_and_the_text_stays_greedy(client, gen):
    greedy = gen.generate(PROMPTS[0], 20, strategy="greedy")
    body = client.post(
        "/v1/completions",
        json={
            "prompt": PROMPTS[0],
            "max_tokens": 20,
            "jacobi": {"strategy": "jacobi", "jacobi": {"window": 4, "probe_every": 4}},
        },
    ).json()
    assert body["choices"][0]["text"] == greedy.text
    assert body["jacobi"]["window"] == 4 and body["jacobi"]["adaptive"]  # the config's Jacobi window, adapted
    body = client.post(
        "/v1/completions",
        json={
            "prompt": PROMPTS[0],
            "max_tokens": 20,
            "jacobi": {
                "strategy": "lookahead",
                "lookahead": {"branches": 1, "margin": 0.0},
                "costs.pass_costs": {"1": 1.0, "64": 1.0},
            },
        },
    ).json()
    assert body["choices"][0]["text"] == greedy.text and body["jacobi"]["strategy"] == "lookahead"


def test_token_id_prompt_and_list_of_one_prompt(client, gen):
    ids = gen.tokenizer.encode(PROMPTS[1])
    expected = gen.generate(ids, 8).text
    for prompt in (ids, [ids], [PROMPTS[1]]):
        assert (
            client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8}).json()["choices"][0]["text"]
            == expected
        )


def test_default_max_tokens_is_16(client, gen):
    body = client.post("/v1/completions", json={"prompt": PROMPTS[2]}).json()
    assert body["choices"][0]["text"] == gen.generate(PROMPTS[2], 16).text


def test_stop_string_cuts_the_text(client, gen):
    full = gen.generate(PROMPTS[0], 24).text
    stop = full.strip()[3:6]
    assert stop.strip()
    body = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 24, "stop": [stop]}).json()
    assert body["choices"][0]["text"] == gen.generate(PROMPTS[0], 24, stop=stop).text == full[: full.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_streamed_completion_joins_to_generate(client, gen, prompt):
    events, done = stream(client, "/v1/completions", {"prompt": prompt, "max_tokens": 16})
    result = gen.generate(prompt, 16)
    assert done and streamed_text(events) == result.text
    assert all(e["object"] == "text_completion" and e["id"] == events[0]["id"] for e in events)
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["jacobi"]["tokens_per_pass"] >= 1.0 and "usage" not in events[-1]


def test_chat_equals_generate(client, gen):
    body = client.post("/v1/chat/completions", json={"model": "llama", "messages": MESSAGES, "max_tokens": 12}).json()
    result = gen.generate(messages=MESSAGES, max_new_tokens=12)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": result.text}
    check_usage(body, result)


def test_chat_text_parts_are_joined(client, gen):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]}]
    body = client.post("/v1/chat/completions", json={"messages": parts, "max_completion_tokens": 6}).json()
    assert (
        body["choices"][0]["message"]["content"]
        == gen.generate(messages=[{"role": "user", "content": "Name a colour."}], max_new_tokens=6).text
    )


def test_streamed_chat_with_usage(client, gen):
    events, done = stream(
        client,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 12, "stream_options": {"include_usage": True}},
    )
    result = gen.generate(messages=MESSAGES, max_new_tokens=12)
    assert done
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    *chunks, usage = events
    assert streamed_text(chunks) == result.text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(result.ids)


def test_chat_without_max_tokens_runs_to_eos_or_the_context(client, gen):
    body = client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()
    result = gen.generate(messages=MESSAGES, max_new_tokens=gen.manifest.max_context)
    assert body["choices"][0]["message"]["content"] == result.text
    assert body["usage"]["total_tokens"] <= gen.manifest.max_context


@pytest.mark.slow
def test_smollm2_chat_with_its_template(start_server, generator):
    """The real SmolLM2-135M-Instruct and its chat template, streamed and not."""
    import httpx

    server = start_server("smollm2-135m")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    expected = generator("smollm2-135m").generate(messages=messages, max_new_tokens=12, strategy="greedy").text
    assert "Paris" in expected
    with httpx.Client(base_url=server.url, timeout=120) as c:
        body = c.post(
            "/v1/chat/completions", json={"model": "smollm2-135m", "messages": messages, "max_tokens": 12}
        ).json()
        assert body["choices"][0]["message"]["content"] == expected
        events, done = stream(c, "/v1/chat/completions", {"messages": messages, "max_tokens": 12})
        assert done and streamed_text(events) == expected
