"""Sampling over HTTP: seeds reproduce, n choices are n seeds, logprobs in OpenAI's shapes, drawn seeds come back."""

from __future__ import annotations

import pytest
from sse_client import stream

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
HI = [{"role": "user", "content": "Tell me a story"}]


def test_a_seed_reproduces_the_text_and_equals_the_api(client, gen):
    body = {
        "prompt": "The quick brown fox",
        "max_tokens": 16,
        "temperature": 0.9,
        "top_p": 0.95,
        "top_k": 50,
        "min_p": 0.01,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.1,
        "seed": 42,
    }
    first, again = client.post(COMPLETIONS, json=body).json(), client.post(COMPLETIONS, json=body).json()
    assert first["choices"][0]["text"] == again["choices"][0]["text"]
    assert first["jacobi"]["seed"] == 42
    expected = gen.generate(
        "The quick brown fox",
        max_new_tokens=16,
        temperature=0.9,
        top_p=0.95,
        top_k=50,
        min_p=0.01,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=0.1,
        seed=42,
    )
    assert first["choices"][0]["text"] == expected.text
    other = client.post(COMPLETIONS, json={**body, "seed": 43, "jacobi": {"strategy": "jacobi"}}).json()
    assert other["choices"][0]["text"] != first["choices"][0]["text"]


def test_no_seed_draws_one_and_returns_it(client):
    body = {"messages": HI, "max_tokens": 12, "temperature": 1.0}
    drawn = client.post(CHAT, json=body).json()
    seed = drawn["jacobi"]["seed"]
    assert isinstance(seed, int)
    again = client.post(CHAT, json={**body, "seed": seed}).json()
    assert again["choices"][0]["message"]["content"] == drawn["choices"][0]["message"]["content"]
    assert client.post(CHAT, json={"messages": HI, "max_tokens": 4}).json()["jacobi"]["seed"] is None  # greedy


def test_n_choices_are_seeds_seed_plus_i(client, gen):
    reply = client.post(
        COMPLETIONS, json={"prompt": "The quick", "max_tokens": 10, "temperature": 1.0, "seed": 7, "n": 3}
    ).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert reply["jacobi"]["seeds"] == [7, 8, 9]
    for choice, seed in zip(reply["choices"], (7, 8, 9)):
        assert choice["text"] == gen.generate("The quick", max_new_tokens=10, temperature=1.0, seed=seed).text
    assert reply["usage"]["completion_tokens"] == 30
    events, done = stream(
        client, COMPLETIONS, {"prompt": "The quick", "max_tokens": 10, "temperature": 1.0, "seed": 7, "n": 2}
    )
    assert done
    texts = {0: "", 1: ""}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
    assert [texts[0], texts[1]] == [c["text"] for c in reply["choices"][:2]]
    assert sorted(c["index"] for e in events for c in e["choices"] if c["finish_reason"]) == [0, 1]


def test_chat_logprobs_shape(client):
    reply = client.post(
        CHAT, json={"messages": HI, "max_tokens": 6, "temperature": 0.7, "seed": 1, "logprobs": True, "top_logprobs": 3}
    ).json()
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == reply["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-9
        assert entry["bytes"] == list(entry["token"].encode())
    plain = client.post(CHAT, json={"messages": HI, "max_tokens": 6, "logprobs": True}).json()
    assert all(
        e["top_logprobs"] == [] for e in plain["choices"][0]["logprobs"]["content"]
    )  # top_logprobs defaults to 0
    assert client.post(CHAT, json={"messages": HI, "max_tokens": 2}).json()["choices"][0]["logprobs"] is None


def test_completion_logprobs_shape_and_streamed(client):
    body = {"prompt": "The quick", "max_tokens": 8, "temperature": 0.8, "seed": 3, "logprobs": 5}
    lp = client.post(COMPLETIONS, json=body).json()["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 8
    assert all(len(top) <= 5 for top in lp["top_logprobs"]) and lp["text_offset"][0] == 0
    events, _ = stream(client, COMPLETIONS, body)
    carried = [c["logprobs"] for e in events for c in e["choices"] if c["logprobs"]]
    assert len(carried) > 1  # each chunk carries its own tokens' logprobs, not all in the closing chunk
    for key in lp:
        assert [v for part in carried for v in part[key]] == lp[key]


def test_openai_client_sampling(llama_server):
    openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")
    with openai.OpenAI(base_url=llama_server.url + "/v1", api_key="unused", max_retries=0) as api:
        kwargs = dict(
            model="llama", messages=HI, max_tokens=8, temperature=0.8, seed=5, n=2, logprobs=True, top_logprobs=2
        )
        a, b = api.chat.completions.create(**kwargs), api.chat.completions.create(**kwargs)
        assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
        assert len(a.choices[0].logprobs.content[0].top_logprobs) == 2
        with pytest.raises(openai.BadRequestError, match="top_p"):
            api.chat.completions.create(model="llama", messages=HI, top_p=1.5)


def test_greedy_with_penalties_reports_no_seed(each_mode):
    """Penalties without a temperature: nothing is drawn, so there is no seed to report (nor to reproduce with)."""
    import httpx

    server = each_mode()
    body = {"prompt": "The quick", "max_tokens": 6, "repetition_penalty": 1.3, "presence_penalty": 0.5}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        replies = [c.post(COMPLETIONS, json=body).json(), c.post(COMPLETIONS, json={**body, "n": 2}).json()]
    for reply in replies:
        assert reply["jacobi"]["seed"] is None, reply["jacobi"]
    assert replies[1]["jacobi"]["seeds"] == [None, None]
    assert replies[0]["choices"][0]["text"] == replies[1]["choices"][1]["text"]  # greedy: every choice alike
