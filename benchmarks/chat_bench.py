"""Multi-turn chats through `jacobi-rt serve` with the official `openai` client: the prefix cache on and off.

Two servers of the same artifact run side by side (one with --no-prefix-cache), each in its own
process. Measured:

1. one long chat (a system prompt of about --system-tokens tokens, --turns turns): every turn is
   sent to both servers, taking turns which goes first; time to first token per turn, the cached
   prompt tokens (`usage.prompt_tokens_details.cached_tokens`), every reply equal;
2. --clients concurrent clients, each its own chat of --client-turns turns, on one server and then
   the other (twice, alternating): total wall time;
3. requests with no shared prefix (the bundled prompts, one client): tokens/s and TTFT on both;
4. (`--parts pool`, no server) lookahead's tokens per pass on later turns, the n-gram pool handed
   over with the kept prefix or not.

    python -m benchmarks.chat_bench build/smollm2-135m --out docs/bench/chat.json
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from .load_bench import PROMPTS, local_server

TOPICS = [
    "tides",
    "bread",
    "volcanoes",
    "chess",
    "owls",
    "glass",
    "rivers",
    "bees",
    "clocks",
    "maps",
    "salt",
    "kites",
    "frost",
    "caves",
    "comets",
    "ferns",
]


def system_prompt(tokens: int) -> str:
    """A long, plain system prompt of about `tokens` tokens (house rules of a support desk)."""
    rules = [
        f"Rule {i}: when a customer asks about topic number {i}, answer politely, cite the handbook section {i}, "
        f"and keep the answer under three sentences."
        for i in range(1, 400)
    ]
    text, words = "You are the support assistant of a small shop.", 8
    for rule in rules:
        if words >= tokens * 0.75:
            break
        text += " " + rule
        words += len(rule.split())
    return text


def ask(client, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat turn: the reply, time to first token, cached prompt tokens."""
    started = time.perf_counter()
    first, text, usage = None, "", None
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - started
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    wall = time.perf_counter() - started
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return {
        "text": text,
        "ttft": first or wall,
        "wall": wall,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": cached,
    }


def long_chat(clients: dict, model: str, system: str, turns: int, max_tokens: int) -> list[dict]:
    messages = {name: [{"role": "system", "content": system}] for name in clients}
    rows = []
    for turn in range(turns):
        question = f"Customer question {turn + 1}: tell me about {TOPICS[turn % len(TOPICS)]} in one sentence."
        order = list(clients) if turn % 2 == 0 else list(reversed(clients))
        replies = {}
        for name in order:
            messages[name].append({"role": "user", "content": question})
            replies[name] = ask(clients[name], model, messages[name], max_tokens)
            messages[name].append({"role": "assistant", "content": replies[name]["text"]})
        rows.append(
            {
                "turn": turn + 1,
                **{f"{name}_{k}": v for name, r in replies.items() for k, v in r.items() if k != "text"},
                "same": replies["cache"]["text"] == replies["nocache"]["text"],
            }
        )
        click.echo(
            f"turn {turn + 1}: prompt {replies['cache']['prompt_tokens']} tokens, "
            f"cached {replies['cache']['cached_tokens']}; "
            f"ttft {replies['cache']['ttft'] * 1000:.0f} ms vs {replies['nocache']['ttft'] * 1000:.0f} ms without "
            f"the cache; same reply: {rows[-1]['same']}",
            err=True,
        )
    return rows


def many_chats(
    client, model: str, count: int, turns: int, max_tokens: int, system: str
) -> tuple[float, list[list[str]]]:
    """`count` clients at once, each a chat of `turns` turns; (wall seconds, each client's replies)."""
    barrier = threading.Barrier(count)

    def one(i: int) -> list[str]:
        messages = [{"role": "system", "content": f"{system} You serve customer {i}."}]
        barrier.wait()
        replies = []
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Tell me about {TOPICS[(i + turn) % len(TOPICS)]}, briefly."})
            replies.append(ask(client, model, messages, max_tokens)["text"])
            messages.append({"role": "assistant", "content": replies[-1]})
        return replies

    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        replies = list(pool.map(one, range(count)))
    return time.perf_counter() - started, replies


def complete(client, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion of a raw prompt (no chat template): TTFT and tokens/s."""
    started, first, tokens = time.perf_counter(), None, 0
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    wall = time.perf_counter() - started
    return {"ttft": first or wall, "tokens_per_second": tokens / wall}


def unshared(clients: dict, model: str, prompts: list[str], max_tokens: int) -> dict:
    """Prompts that share no prefix, each sent to both servers (taking turns which goes first): medians per server."""
    runs: dict[str, list[dict]] = {name: [] for name in clients}
    for i, prompt in enumerate(prompts):
        for name in list(clients) if i % 2 == 0 else list(reversed(clients)):
            runs[name].append(complete(clients[name], model, prompt, max_tokens))
    out = {
        name: {key: statistics.median(r[key] for r in rs) for key in ("ttft", "tokens_per_second")}
        for name, rs in runs.items()
    }
    out["speed_ratio"] = out["cache"]["tokens_per_second"] / out["nocache"]["tokens_per_second"]
    out["ttft_ratio"] = out["nocache"]["ttft"] / out["cache"]["ttft"]
    return out


def warm_pool(artifact: str, system: str, turns: int, max_tokens: int, chats: int) -> dict:
    """Lookahead's tokens per pass on turns 2.. of `chats` chats, lone calls (no server), with the n-gram pool
    handed over with the kept prefix and without (`prefix_cache.guesses`); both generators take turns."""
    from jacobi_rt.runtime import Generator

    gens = {
        name: Generator.load(artifact, verify=False, config={"prefix_cache.guesses": warm})
        for name, warm in (("warm", True), ("cold", False))
    }
    per_pass: dict[str, list[float]] = {name: [] for name in gens}
    for chat in range(chats):
        messages = {name: [{"role": "system", "content": system}] for name in gens}
        for turn in range(turns):
            question = f"Tell me about {TOPICS[(chat + turn) % len(TOPICS)]}, then repeat your first sentence."
            for name, gen in gens.items():
                messages[name].append({"role": "user", "content": question})
                result = gen.generate(messages=messages[name], max_new_tokens=max_tokens, strategy="lookahead")
                messages[name].append({"role": "assistant", "content": result.text})
                if turn:
                    per_pass[name].append(result.stats.tokens_per_pass)
    out = {name: statistics.mean(values) for name, values in per_pass.items()}
    out["ratio"] = out["warm"] / out["cold"]
    return out


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--system-tokens", type=click.IntRange(0), default=800, show_default=True, help="The long chat's system prompt."
)
@click.option("--turns", type=click.IntRange(2), default=6, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--clients", type=click.IntRange(1), default=16, show_default=True)
@click.option("--client-turns", type=click.IntRange(1), default=4, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=None, help="Each server's --threads.")
@click.option(
    "--parts",
    default="long,many,unshared",
    show_default=True,
    help="What to run: the long chat, the many clients' chats, requests sharing no prefix (through the "
    "server), lookahead's n-gram pool handed over or not (pool; lone calls).",
)
@click.option("--off-first", is_flag=True, help="Start the server without the cache first.")
@click.option(
    "--serve-args", default="", help="More `jacobi-rt serve` options for both servers (e.g. '--decoding FIELD=VALUE')."
)
@click.option("--out", type=click.Path(dir_okay=False), default="build/chat_bench.json", show_default=True)
def main(artifact, system_tokens, turns, max_tokens, clients, client_turns, threads, parts, off_first, serve_args, out):
    """Multi-turn chats with the prefix cache on and off, side by side (needs the `openai` package)."""
    from openai import OpenAI

    model = Path(artifact).resolve().name
    system = system_prompt(system_tokens)
    report = {"command": " ".join(sys.argv), "artifact": artifact}
    if "pool" in parts.split(","):
        report["warm_pool"] = warm_pool(artifact, system[:400], turns, max_tokens, chats=4)
        click.echo(f"lookahead tokens/pass on turns 2-{turns}: {report['warm_pool']}", err=True)
    if {"long", "many", "unshared"} & set(parts.split(",")):
        more = serve_args.split()
        started = [
            local_server(artifact, 64, threads, None, extra=extra) for extra in (more, [*more, "--no-prefix-cache"])
        ]
        # Which server starts first matters on this machine (an A/A run, both without the cache, measured the
        # first one 12% slower), so --off-first swaps it.
        with started[-off_first] as first, started[1 - off_first] as second:
            on, off = (second, first) if off_first else (first, second)
            client = {
                "cache": OpenAI(base_url=on + "/v1", api_key="-"),
                "nocache": OpenAI(base_url=off + "/v1", api_key="-"),
            }
            if "long" in parts:
                report["long_chat"] = long_chat(client, model, system, turns, max_tokens)
                later = report["long_chat"][1:]
                report["ttft_ratio_later_turns"] = statistics.median(r["nocache_ttft"] / r["cache_ttft"] for r in later)
            if "many" in parts:
                walls, answers = {"cache": [], "nocache": []}, {}
                for round_ in range(2):
                    for name in ("cache", "nocache") if round_ == 0 else ("nocache", "cache"):
                        wall, answers[name] = many_chats(
                            client[name], model, clients, client_turns, max_tokens, system[:400]
                        )
                        walls[name].append(wall)
                        click.echo(f"{clients} clients x {client_turns} turns, {name}: {wall:.1f} s", err=True)
                report["many_chats"] = {
                    "walls": walls,
                    "ratio": statistics.mean(walls["nocache"]) / statistics.mean(walls["cache"]),
                    "same": answers["cache"] == answers["nocache"],
                }
            if "unshared" in parts:
                prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
                prompts = [f"{i}. {p}" for i, p in enumerate(prompts)]  # distinct from their first token on
                report["unshared"] = unshared(client, model, prompts, max_tokens)
    click.echo(
        json.dumps(
            {key: report.get(key) for key in ("ttft_ratio_later_turns",)}
            | {
                "many_chats": report.get("many_chats", {}).get("ratio"),
                "unshared": report.get("unshared", {}).get("speed_ratio"),
                "warm_pool": report.get("warm_pool", {}).get("ratio"),
            }
        )
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
