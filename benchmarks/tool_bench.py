"""Constrained tool-call turns, strategies side by side (issue 37's goal: auto >= 1.5x constrained greedy).

    python -m benchmarks.tool_bench TARGET [--draft DRAFT] [--threads 2] [--repeats 2] [--out FILE.json]

Each turn is a chat request with tools as the server builds it: tool_choice "auto" by the generic
protocol (server/tool_protocol.py: the tools in a system message, the call-or-answer grammar) and
tool_choice "required" (the JSON array of calls). The strategies take turns on one Generator per turn
(greedy first, one token a pass with every pick masked); per strategy: tokens, passes, tokens per
pass, decode tokens/s (summed over the turns), and whether every output equals greedy's.
"""

from __future__ import annotations

import json

import click

TOOLS = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        },
    },
    {
        "name": "multiply",
        "description": "a times b",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
    {
        "name": "search_flights",
        "description": "Flights between two airports on a date",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["origin", "destination", "date"],
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            },
        },
    },
]
QUESTIONS = [
    "Call multiply with a=6 and b=7.",
    "What is the weather in Oslo, in celsius?",
    "Find me a flight from OSL to CDG on 2026-12-24.",
    "Multiply 123 by 456 for me.",
    "Is it cold in Toronto right now? Use fahrenheit.",
    "Book-keeping: search flights from JFK to LAX on 2027-01-05.",
]
STRATEGIES = ("greedy", "jacobi", "lookahead", "speculative", "auto")


def turns() -> list[tuple[str, str, list[dict], object]]:
    """(name, tool_choice, messages, constraint) of each turn, as the server would build them."""
    from jacobi_rt.runtime.constraints import Constraint
    from jacobi_rt.server.tool_protocol import described, grammar

    functions = {tool["name"]: tool["parameters"] for tool in TOOLS}
    items = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "arguments"],
            "properties": {"name": {"const": name}, "arguments": parameters},
        }
        for name, parameters in functions.items()
    ]
    required = Constraint.json_schema({"type": "array", "minItems": 1, "items": {"anyOf": items}})
    generic = Constraint.lark(grammar(functions, True))
    out = []
    for i, question in enumerate(QUESTIONS):
        asked = [{"role": "user", "content": question}]
        out.append((f"auto-{i}", "auto", described(asked, TOOLS, True), generic))
        out.append((f"required-{i}", "required", asked, required))
    return out


@click.command()
@click.argument("target", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--draft", type=click.Path(exists=True, file_okay=False), default=None, help="A draft (speculative, auto)."
)
@click.option("--threads", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1, 1024), default=96, show_default=True)
@click.option("--repeats", type=click.IntRange(1, 20), default=2, show_default=True, help="Rounds over the turns.")
@click.option(
    "--strategies", default="greedy,auto", show_default=True, help="Comma-separated; greedy is the reference."
)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write every run as JSON here.")
def main(target, draft, threads, max_new_tokens, repeats, strategies, out):
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.params import GenerationParams

    names = ["greedy"] + [s for s in strategies.split(",") if s and s != "greedy"]
    gen = Generator.load(target, draft=draft, threads=threads)
    runs = []
    for round_ in range(repeats):
        for name, choice, messages, constraint in turns():
            texts = {}
            for strategy in names:
                result = gen.generate(
                    messages=messages,
                    max_new_tokens=max_new_tokens,
                    strategy=strategy,
                    params=GenerationParams(constraint=constraint),
                )
                texts[strategy] = result.ids
                s = result.stats
                kind = "call" if result.text[:1] in ("{", "[") else "answer"
                runs.append(
                    {
                        "round": round_,
                        "turn": name,
                        "tool_choice": choice,
                        "kind": kind,
                        "strategy": strategy,
                        "text": result.text,
                        "tokens": s.new_tokens,
                        "passes": s.target_passes,
                        "decode_seconds": max(s.wall_seconds - s.prefill_seconds, 1e-9),
                        "same_as_greedy": result.ids == texts["greedy"],
                    }
                )
                print(
                    f"{round_} {name:<12} {strategy:<11} {s.new_tokens:>3} tok {s.target_passes:>3} passes "
                    f"{s.decode_tokens_per_second:>7.1f} tok/s  {result.text[:60]!r}",
                    flush=True,
                )
    _table(runs, names)
    if out:
        with open(out, "w") as f:
            json.dump(runs, f, indent=1)


def _table(runs: list[dict], names: list[str]) -> None:
    print("\n| turns | strategy | tokens | passes | tokens/pass | decode tok/s | vs greedy | same as greedy |")
    print("|---|---|---|---|---|---|---|---|")
    groups = {
        "auto, a call": ("auto", "call"),
        "auto, a plain answer": ("auto", "answer"),
        "required": ("required", "call"),
        "every tool-call turn": (None, "call"),
        "all": (None, None),
    }
    for label, (choice, kind) in groups.items():
        base = None
        for strategy in names:
            mine = [
                r
                for r in runs
                if r["strategy"] == strategy and choice in (None, r["tool_choice"]) and kind in (None, r["kind"])
            ]
            if not mine:
                continue
            tokens, passes = sum(r["tokens"] for r in mine), sum(r["passes"] for r in mine)
            # decode tokens/s as Stats counts it: the tokens after the first, over the time after the prefill
            rate = sum(max(r["tokens"] - 1, 0) for r in mine) / sum(r["decode_seconds"] for r in mine)
            base = rate if strategy == "greedy" else base
            same = sum(r["same_as_greedy"] for r in mine)
            print(
                f"| {label} | {strategy} | {tokens} | {passes} | {tokens / max(passes, 1):.2f} | {rate:.1f} | "
                f"{rate / base:.2f}x | {same}/{len(mine)} |"
            )


if __name__ == "__main__":
    main()
