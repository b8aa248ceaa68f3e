"""The prefix cache: a reused prefix gives what a fresh prefill gives, for lone calls and the batcher's rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from jacobi_rt.runtime import Generator
from jacobi_rt.runtime.config import PrefixCacheConfig
from jacobi_rt.runtime.prefix_cache import PrefixCache

SYSTEM = "Be brief. "


def conversation(gen: Generator, cold: Generator, name: str, turns: int = 4, **options) -> list:
    """A chat of `turns` turns on `gen` (cached) and `cold` (no cache), asserting each reply equal; the stats."""
    messages = [{"role": "system", "content": SYSTEM + name}, {"role": "user", "content": f"Hi, {name}."}]
    stats = []
    for turn in range(turns):
        warm, fresh = gen.generate(messages=messages, **options), cold.generate(messages=messages, **options)
        assert warm.ids == fresh.ids, (name, turn, options)
        stats.append(warm.stats)
        messages += [{"role": "assistant", "content": warm.text}, {"role": "user", "content": f"More {turn}."}]
    return stats


def reused_each_previous_prompt(stats) -> bool:
    """Each turn held at least the previous turn's prompt (a few tokens less where the tokenizer merges across
    the assistant header's end)."""
    return all(later.cached_tokens >= earlier.prompt_tokens - 3 for earlier, later in zip(stats, stats[1:]))


def pair(artifact, family: str, **kw) -> tuple[Generator, Generator]:
    load = dict(threads=1, verify=False, **kw)
    return Generator.load(artifact(family), **load), Generator.load(artifact(family), prefix_cache=False, **load)


# -- the policy ------------------------------------------------------------------------------------


def test_a_hit_reuses_the_longest_shared_prefix_but_always_runs_the_last_prompt_token():
    cache = PrefixCache(config=PrefixCacheConfig(min_tokens=4))
    cache.keep(2, list(range(10)))
    cache.keep(3, [0, 1, 2, 3, 4, 99])
    choice = cache.choose(list(range(8)) + [50], range(1, 4))
    assert (choice.place, choice.reuse) == (2, 8) and choice.kept.tokens == list(range(10))
    repeat = PrefixCache(config=PrefixCacheConfig(min_tokens=4))
    repeat.keep(0, list(range(10)))
    assert repeat.choose(list(range(10)), range(0, 1)).reuse == 9  # an exact repeat: its last token still runs
    assert (cache.queries, cache.hits, cache.cached_tokens) == (1, 1, 8)


def test_short_or_wasteful_hits_take_a_free_slot_and_the_oldest_kept_slot_is_evicted_last():
    cache = PrefixCache(config=PrefixCacheConfig(min_tokens=4))
    cache.keep(1, [7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8])  # a long conversation sharing a 3-token header
    assert cache.choose([7, 7, 7, 9], range(0, 3)).place == 0 and 1 in cache.kept  # below min_tokens: a free slot
    cache.keep(2, [5] * 30)
    assert cache.choose([5] * 5 + [1], range(0, 3)).place == 0  # 5 of 30: would waste a kept conversation
    cache.keep(0, [8] * 4)
    evicted = cache.choose([6, 6], range(0, 3))  # no free slot, no hit: the least recently kept goes
    assert (evicted.place, evicted.reuse) == (1, 0) and 1 not in cache.kept


# -- lone calls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_a_conversation_of_lone_calls_reuses_each_turn_and_equals_fresh_prefills(artifact, family):
    gen, cold = pair(artifact, family)
    greedy = conversation(gen, cold, "Ada", max_new_tokens=12, strategy="greedy")
    assert greedy[0].cached_tokens == 0 and reused_each_previous_prompt(greedy)
    sampled = conversation(gen, cold, "Bo", max_new_tokens=12, strategy="lookahead", temperature=0.9, seed=5)
    assert all(s.cached_tokens > 0 for s in sampled[1:])
    assert all(s.cached_tokens == 0 for s in conversation(cold, cold, "Cy", turns=2, max_new_tokens=8))


def test_an_exact_repeat_and_a_prefix_ending_inside_an_answer_equal_fresh_prefills(artifact):
    gen, cold = pair(artifact, "llama")
    prompt = list(range(5, 45))
    first = gen.generate(prompt, max_new_tokens=16, strategy="greedy")
    again = gen.generate(prompt, max_new_tokens=16, strategy="jacobi")
    assert again.ids == first.ids and again.stats.cached_tokens == len(prompt) - 1
    inside = prompt + first.ids[:5] + [7, 8, 9]  # shares the prompt and part of the answer
    warm, fresh = gen.generate(inside, max_new_tokens=12), cold.generate(inside, max_new_tokens=12)
    assert warm.ids == fresh.ids and warm.stats.cached_tokens == len(prompt) + 5


def test_the_lookahead_pool_and_the_draft_cache_travel_with_the_conversation(artifact):
    gen, cold = pair(artifact, "llama", draft=artifact("llama-draft1"))
    stats = conversation(gen, cold, "Di", turns=3, max_new_tokens=12, strategy="lookahead")
    assert all(s.proposer.get("warm_pool") for s in stats[1:]) and not stats[0].proposer.get("warm_pool")
    spec = conversation(gen, cold, "Ed", turns=3, max_new_tokens=12, strategy="speculative")
    assert all(s.proposer["cached"] > 0 for s in spec[1:] if s.proposer["draft_passes"])


def test_lone_calls_keep_at_most_the_configured_contexts(artifact):
    gen = Generator.load(artifact("llama"), threads=1, verify=False, config={"prefix_cache.contexts": 2})
    for i in range(5):
        gen.generate([5 + i] * 30, max_new_tokens=4)
    assert len(gen.lone_cache.kept) == 2
    assert gen.generate([8] * 30, max_new_tokens=4).stats.cached_tokens == 29  # the latest two stay
    assert gen.generate([5] * 30, max_new_tokens=4).stats.cached_tokens == 0  # the least recently used were closed
    gen.close()
    assert not gen.lone_cache.kept


# -- the batcher's slots ------------------------------------------------------------------------------


def test_engine_rows_of_several_conversations_reuse_their_own_prefixes(artifact):
    gen, cold = pair(artifact, "llama", graph="inplace")
    gen.start_batching(4)
    try:
        with ThreadPoolExecutor(3) as pool:
            runs = list(
                pool.map(
                    lambda n: conversation(gen, cold, n, max_new_tokens=6 + len(n) // 4, strategy="lookahead"),
                    ["Fay", "Gus of the hills", "Hal"],
                )
            )
        cache = gen.batcher.cache
    finally:
        gen.stop_batching()
    assert all(reused_each_previous_prompt(stats) for stats in runs)
    assert cache.hits >= 9 and cache.queries == 12


def test_engine_rows_hand_their_seated_drafts_cache_to_the_next_turn(artifact):
    gen, cold = pair(artifact, "llama", graph="inplace", draft=artifact("llama-draft1"))
    gen.start_batching(2)
    try:
        assert gen.batcher.drafts is not None  # the drafts sit on the batcher's draft slots
        stats = conversation(
            gen, cold, "Pia", turns=3, max_new_tokens=10, strategy="speculative", config={"draft.length": 2}
        )
        free = sorted(gen.batcher.drafts.free)
    finally:
        gen.stop_batching()
    assert all(s.proposer["draft_passes"] for s in stats) and all(s.proposer["cached"] > 0 for s in stats[1:])
    assert free == [0, 1]  # a finished row's draft cache was copied out and its seat freed


def test_eviction_under_pressure_keeps_every_answer_equal(artifact):
    gen, cold = pair(artifact, "qwen2", graph="inplace")
    gen.start_batching(2)
    try:
        with ThreadPoolExecutor(5) as pool:
            list(
                pool.map(
                    lambda n: conversation(gen, cold, n, turns=3, max_new_tokens=8, strategy="greedy"),
                    ["Ivy", "Jo", "Kai", "Lu", "Max"],
                )
            )
        cache = gen.batcher.cache
    finally:
        gen.stop_batching()
    assert cache.queries == 15 and len(cache.kept) <= 2


@pytest.mark.slow
def test_smollm2_chat_turns_reuse_their_prefix_and_equal_fresh_prefills(artifact):
    gen, cold = pair(artifact, "smollm2-135m")
    stats = conversation(gen, cold, "Nia", turns=3, max_new_tokens=24, strategy="auto")
    assert reused_each_previous_prompt(stats)


def test_without_the_guesses_only_the_kv_is_kept(artifact):
    gen, cold = pair(artifact, "llama", config={"prefix_cache.guesses": False})
    stats = conversation(gen, cold, "Ona", turns=3, max_new_tokens=10, strategy="lookahead")
    assert reused_each_previous_prompt(stats) and not any(s.proposer.get("warm_pool") for s in stats)
