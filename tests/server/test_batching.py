"""The server on the batcher (max_batch): shared passes over real HTTP, each answer its solo greedy's."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sse_client import stream, streamed_text

from jacobi_rt.runtime import Generator
from jacobi_rt.runtime.errors import InputError
from jacobi_rt.server.run import BackgroundServer
from jacobi_rt.server.settings import ServerSettings

WORDS = "apples rivers stars tables clouds music trains paper glass wolves maps salt bells roads ice honey".split()
STRATEGIES = ("greedy", "jacobi", "lookahead", "auto")


@pytest.fixture
def batched(artifact):
    """batched(**settings) -> (a started server on its own batcher over the tiny llama, its Generator)."""
    started = []

    def start(**settings):
        gen = Generator.load(artifact("llama"), graph="inplace", threads=1)
        server = BackgroundServer(gen, ServerSettings(model_id="llama", **settings)).start()
        started.append(server)
        return server, gen

    yield start
    for server in started:
        server.stop()


def metric(c: httpx.Client, line_start: str) -> float:
    text = c.get("/metrics").text
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])


def wait_until(condition, seconds: float = 20.0) -> None:
    limit = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < limit, "timed out waiting"
        time.sleep(0.02)


def test_sixteen_clients_share_passes_and_each_gets_its_solo_answer(batched):
    server, gen = batched(max_batch=4, queue_size=16)
    prompts = [f"Client {i} asks about {word}" for i, word in enumerate(WORDS)]
    expected = [gen.generate(p, max_new_tokens=12, strategy="greedy").text for p in prompts]
    barrier = threading.Barrier(len(prompts))

    def ask(i: int) -> str:
        body = {"prompt": prompts[i], "max_tokens": 12, "jacobi": {"strategy": STRATEGIES[i % 4]}}
        with httpx.Client(base_url=server.url, timeout=120) as c:
            barrier.wait()
            if i % 2:
                events, done = stream(c, "/v1/completions", body)
                assert done
                return streamed_text(events)
            return c.post("/v1/completions", json=body).json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(ask, range(len(prompts))))
    assert answers == expected
    with httpx.Client(base_url=server.url) as c:
        single, passes = metric(c, 'jacobi_rt_batch_rows_bucket{le="1.0"}'), metric(c, "jacobi_rt_batch_rows_count")
        assert passes > single  # some passes were shared (the tiny model is fast: requests trickle in)
        assert metric(c, "jacobi_rt_batch_tokens_sum") >= 16 * 12
        # 3 of these prompts make 12 tokens of no text (incomplete UTF-8): their first token still counts
        assert metric(c, 'vllm:time_to_first_token_seconds_count{model_name="llama"}') == 16
        assert metric(c, 'vllm:num_requests_running{model_name="llama"}') == 0
        assert metric(c, "jacobi_rt_slots") == 4
    assert gen.batcher.running == 0


def test_stop_strings_and_limits_stay_per_request(batched):
    server, gen = batched(max_batch=3)
    full = gen.generate("The river", max_new_tokens=24, strategy="greedy").text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    bodies = [
        {"prompt": "The river", "max_tokens": 24, "stop": stop, "jacobi": {"strategy": "lookahead"}},
        {"prompt": "The river", "max_tokens": 5, "jacobi": {"strategy": "jacobi"}},
        {"prompt": "The river", "max_tokens": 24},
    ]
    with ThreadPoolExecutor(3) as pool, httpx.Client(base_url=server.url, timeout=60) as c:
        replies = list(pool.map(lambda b: c.post("/v1/completions", json=b).json()["choices"][0], bodies))
    assert replies[0]["text"] == full[: full.index(stop)] and replies[0]["finish_reason"] == "stop"
    assert replies[1]["text"] == gen.generate("The river", max_new_tokens=5, strategy="greedy").text
    assert replies[1]["finish_reason"] == "length" and replies[2]["text"] == full


def test_a_prompt_over_the_context_fails_alone(batched):
    server, gen = batched(max_batch=2)
    long = "word " * (gen.limits.max_context + 10)
    with ThreadPoolExecutor(3) as pool, httpx.Client(base_url=server.url, timeout=60) as c:
        replies = list(
            pool.map(
                lambda p: c.post("/v1/completions", json={"prompt": p, "max_tokens": 8}), ["The river", long, "The sea"]
            )
        )
    assert [r.status_code for r in replies] == [200, 400, 200]
    assert replies[1].json()["error"]["code"] == "context_length_exceeded"
    assert replies[2].json()["choices"][0]["text"] == gen.generate("The sea", max_new_tokens=8, strategy="greedy").text


def test_a_disconnect_frees_its_slot_within_a_pass(batched):
    server, gen = batched(max_batch=1, queue_size=1)
    gen.batcher.stats.observers.append(lambda record: time.sleep(0.02))  # 20 ms a pass: 240 tokens take seconds
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream(
            "POST",
            "/v1/completions",
            json={"prompt": "The quick", "max_tokens": 240, "stream": True, "jacobi": {"strategy": "greedy"}},
        ) as response:
            next(response.iter_lines())  # the first piece arrived; then the client leaves
        wait_until(lambda: metric(c, 'jacobi_rt_generations_total{outcome="cancelled"}') == 1)
        wait_until(lambda: gen.batcher.running == 0, seconds=1.0)
        passes = gen.batcher.stats.passes
        reply = c.post("/v1/completions", json={"prompt": "The sea", "max_tokens": 3}).json()
        assert reply["choices"][0]["text"] == gen.generate("The sea", max_new_tokens=3, strategy="greedy").text
        assert gen.batcher.stats.passes - passes < 240  # the left stream's generation did not go on


def test_max_batch_zero_is_refused_with_a_clear_error():
    with pytest.raises(InputError, match="max_batch must be at least 1"):
        ServerSettings(model_id="m", max_batch=0)


def test_the_cli_refuses_max_batch_zero(artifact):
    from click.testing import CliRunner

    from jacobi_rt.tools.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", str(artifact("llama")), "--max-batch", "0"])
    assert result.exit_code != 0 and "'--max-batch': 0 is not in the range x>=1" in result.output


def test_the_slot_context_bounds_requests(batched):
    server, gen = batched(max_batch=2, batch_context=64)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.get("/v1/models").json()["data"][0]["jacobi"]["max_context"] == 64
        over = c.post("/v1/completions", json={"prompt": list(range(5, 65)), "max_tokens": 8})
        assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
        ok = c.post("/v1/completions", json={"prompt": list(range(5, 45)), "max_tokens": 8})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
    with pytest.raises(InputError, match="at least 2 tokens"):
        ServerSettings(model_id="m", batch_context=1)


@pytest.mark.parametrize("cache", [True, False])
def test_the_next_chat_turn_reuses_the_conversation_and_the_usage_and_metrics_say_so(artifact, cache):
    """The official client, two turns of one chat: the second prefills only what is new (OpenAI's
    usage.prompt_tokens_details.cached_tokens, vLLM's prefix cache counters); the replies equal a cold server's."""
    from openai import OpenAI

    gen = Generator.load(artifact("llama"), graph="inplace", threads=1, prefix_cache=cache)
    with BackgroundServer(gen, ServerSettings(model_id="llama")) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="-")
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."}]
        usages, texts = [], []
        for _turn in range(2):
            reply = client.chat.completions.create(model="llama", messages=messages, max_tokens=8)
            usages.append(reply.usage)
            texts.append(reply.choices[0].message.content)
            messages += [{"role": "assistant", "content": texts[-1]}, {"role": "user", "content": "And?"}]
        with httpx.Client(base_url=server.url) as c:
            queries = metric(c, 'vllm:prefix_cache_queries_total{model_name="llama"}')
            hits = metric(c, 'vllm:prefix_cache_hits_total{model_name="llama"}')
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert cached[0] == 0 and queries == usages[0].prompt_tokens + usages[1].prompt_tokens and hits == sum(cached)
    assert (cached[1] >= usages[0].prompt_tokens - 3) if cache else cached[1] == 0
    fresh = Generator.load(artifact("llama"), graph="inplace", threads=1, prefix_cache=False)
    assert texts[1] == fresh.generate(messages=messages[:-2], max_new_tokens=8).text
