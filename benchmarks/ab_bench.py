"""A/B of two jacobi-rt installations, or of two exports of one model: lone streams, the two taking turns.

Each side is a Python with its own jacobi-rt installed (e.g. the previous commit in one virtual
environment, this checkout in another; both default to this Python) and an artifact (B's own with
`--b-artifact`: the export before and after an exporter change); each loads its artifact once in a
worker process of its own, then the prompts run A, B, B, A, ... per strategy (turns alternate who goes first), so a
noisy machine hits both alike (but run both start orders, `--b-first`: the worker started second is
favoured on a 2-core machine). Per side: median tokens/s of the stream (new tokens after the
first / the time after it) and median time to first token, and B / A for both; every answer of
B must equal A's. `--turns N` makes each prompt a conversation of N turns with the prefix cache on
(each side's next turn resends the whole chat, as a chat client does); otherwise the cache is off.

    python -m benchmarks.ab_bench --a /work/base/.venv/bin/python --b .venv/bin/python \\
        build/smollm2-135m --draft build/smollm2-135m-int8 --strategies greedy,lookahead,speculative,auto
    python -m benchmarks.ab_bench build/before --b-artifact build/after --draft build/smollm2-135m-int8

The worker side (`--worker`) uses only the public Generator API that both sides have.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TOPICS = [
    "the sea",
    "prime numbers",
    "a Python function that reverses a string",
    "the Roman Empire",
    "bread",
    "volcanoes",
    "a haiku about rain",
    "how vaccines work",
    "chess openings",
    "the moon landing",
    "compilers",
    "sleep",
    "photosynthesis",
    "a limerick about a cat",
    "binary search",
    "the water cycle",
]


def worker(artifact: str, draft: str | None, threads: int, prefix_cache: bool = False) -> None:
    """Serve requests from stdin (one JSON line each) with one loaded Generator; answer one JSON line each."""
    from jacobi_rt.runtime import Generator

    try:  # the same prompts come back: a prefix cache (since issue 27) would skip their prefill on one side only
        gen = Generator.load(artifact, draft=draft, threads=threads, verify=False, prefix_cache=prefix_cache)
    except TypeError:
        gen = Generator.load(artifact, draft=draft, threads=threads, verify=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        messages = ask["messages"]
        started = time.perf_counter()
        first = None
        stream = gen.start(messages=messages, max_new_tokens=ask["max_new_tokens"], strategy=ask["strategy"])
        for _piece in stream:
            if first is None:
                first = time.perf_counter() - started
        wall = time.perf_counter() - started
        result = stream.result
        after = max(wall - (first or 0.0), 1e-9)
        print(
            json.dumps(
                {
                    "ids": result.ids,
                    "text": result.text,
                    "ttft": first or wall,
                    "tokens_per_second": (len(result.ids) - 1) / after,
                    "tokens_per_pass": result.stats.tokens_per_pass,
                }
            ),
            flush=True,
        )


class Side:
    def __init__(self, python: str, artifact: str, draft: str | None, threads: int, turns: int = 1):
        command = [python, str(Path(__file__).resolve()), "--worker", artifact, "--threads", str(threads)]
        command += (["--draft", draft] if draft else []) + ["--turns", str(turns)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.process.stdout.readline())["ready"]

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def run(
    a: Side, b: Side, strategies: list[str], prompts: list[str], max_new_tokens: int, rounds: int, turns: int = 1
) -> dict:
    table = {}
    for strategy in strategies:
        runs: dict[str, list[dict]] = {"a": [], "b": []}
        mismatches = 0
        for turn in range(rounds):
            for i, prompt in enumerate(prompts):
                messages = [{"role": "user", "content": prompt}]
                for chat_turn in range(turns):
                    first = (i + turn + chat_turn) % 2 == 0
                    order = [("a", a), ("b", b)] if first else [("b", b), ("a", a)]
                    answers = {
                        name: side.ask(messages=messages, max_new_tokens=max_new_tokens, strategy=strategy)
                        for name, side in order
                    }
                    mismatches += answers["a"]["ids"] != answers["b"]["ids"]
                    for name in ("a", "b"):
                        runs[name].append(answers[name])
                    messages = [*messages, {"role": "assistant", "content": answers["a"]["text"]}]
                    messages.append({"role": "user", "content": "Go on."})
        row = {
            name: {
                "tokens_per_second": statistics.median(r["tokens_per_second"] for r in rs),
                "ttft": statistics.median(r["ttft"] for r in rs),
                "tokens_per_pass": statistics.median(r["tokens_per_pass"] for r in rs),
            }
            for name, rs in runs.items()
        }
        row["speed_ratio"] = row["b"]["tokens_per_second"] / row["a"]["tokens_per_second"]
        row["ttft_ratio"] = row["a"]["ttft"] / row["b"]["ttft"]  # > 1: B reaches its first token sooner
        row["mismatches"] = mismatches
        table[strategy] = row
        print(
            f"{strategy:12s} A {row['a']['tokens_per_second']:6.1f} tok/s ttft {row['a']['ttft'] * 1000:6.0f} ms | "
            f"B {row['b']['tokens_per_second']:6.1f} tok/s ttft {row['b']['ttft'] * 1000:6.0f} ms | "
            f"B/A speed {row['speed_ratio']:.3f}, ttft {row['ttft_ratio']:.3f}, mismatches {mismatches}",
            flush=True,
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--a", default=sys.executable, help="the Python of side A (e.g. the previous commit's environment)"
    )
    parser.add_argument("--b", default=sys.executable, help="the Python of side B (default: this one)")
    parser.add_argument("--b-artifact", default=None, help="side B's artifact (default: ARTIFACT, as side A's)")
    parser.add_argument("--strategies", default="greedy,lookahead,speculative,auto")
    parser.add_argument("--prompts", type=int, default=8, help="chat prompts (of 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--turns", type=int, default=1, help="each prompt a chat of this many turns, with the prefix cache on"
    )
    parser.add_argument(
        "--b-first",
        action="store_true",
        help="start B's worker first: two workers on 2 cores favour the one started second, so run "
        "both orders and compare",
    )
    parser.add_argument("--out", default=None, help="write the table as JSON here")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.artifact, args.draft, args.threads, prefix_cache=args.turns > 1)
    strategies = args.strategies.split(",")
    b_artifact = args.b_artifact or args.artifact
    if args.b_first:
        b = Side(args.b, b_artifact, args.draft, args.threads, args.turns)
        a = Side(args.a, args.artifact, args.draft, args.threads, args.turns)
    else:
        a, b = (
            Side(args.a, args.artifact, args.draft, args.threads, args.turns),
            Side(args.b, b_artifact, args.draft, args.threads, args.turns),
        )
    prompts = [f"Tell me about {t}." for t in TOPICS[: args.prompts]]
    try:
        table = run(a, b, strategies, prompts, args.max_new_tokens, args.rounds, args.turns)
    finally:
        a.close()
        b.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "table": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
