"""The main job in one command: greedy vs Jacobi, lookahead and speculative decoding side by side.

    python -m benchmarks.demo build/smollm2-135m [--draft build/smollm2-135m-int8]

Runs each strategy on the same chat prompts, interleaved (A B A B ...) so machine drift hits
all alike, checks every output is token-identical to greedy, and prints tokens/s, tokens per
target pass and the speed ratio to greedy. For the full benchmark use `jacobi-rt bench`.
"""

from __future__ import annotations

import statistics

import click

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring and two examples.",
    "Summarise in three sentences: The Jacobi method, named after Carl Gustav Jacob Jacobi, is an iterative "
    "algorithm for solving a system of linear equations. Each diagonal element is solved for, and an approximate "
    "value is plugged in. The process is then iterated until it converges.",
    "List five tips for staying focused while studying, one line each.",
    "Explain what a hash table is to a beginner programmer.",
]


def run(generator, strategies: list[str], max_new_tokens: int, window: int | None, repeats: int):
    """rows[strategy] -> list of (prompt index, result); outputs compared with greedy."""
    rows = {s: [] for s in strategies}
    for _ in range(repeats):
        for i, prompt in enumerate(PROMPTS):
            for strategy in strategies:
                result = generator.generate(
                    prompt, max_new_tokens=max_new_tokens, strategy=strategy, window=window, chat=True
                )
                rows[strategy].append((i, result))
    return rows


def summarise(rows: dict) -> list[dict]:
    greedy = {i: r for i, r in rows["greedy"]}
    base = statistics.median(r.stats.decode_tokens_per_second for _, r in rows["greedy"])
    table = []
    for strategy, results in rows.items():
        speed = statistics.median(r.stats.decode_tokens_per_second for _, r in results)
        table.append(
            {
                "strategy": strategy,
                "tokens/s": speed,
                "tokens/pass": statistics.median(r.stats.tokens_per_pass for _, r in results),
                "ratio": speed / base,
                "identical": all(r.ids == greedy[i].ids for i, r in results),
            }
        )
    return table


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--draft",
    "-d",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="A draft artifact (jacobi-rt export MODEL --role draft ...) for the speculative strategy.",
)
@click.option(
    "--strategies",
    default="greedy,jacobi,lookahead,speculative,auto",
    show_default=True,
    help="Comma-separated strategies; greedy is always included; speculative only with --draft.",
)
@click.option("--max-new-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--window", type=click.IntRange(1), default=None, help="Window for jacobi; default: the runtime's.")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=None, help="onnxruntime intra-op threads.")
def main(artifact, draft, strategies, max_new_tokens, window, repeats, threads):
    """Greedy vs Jacobi, lookahead and speculative decoding on ARTIFACT, side by side, with the speed ratio."""
    from jacobi_rt.runtime import Generator

    generator = Generator.load(
        artifact, draft=draft, threads=threads, prefix_cache=False
    )  # each strategy prefills its prompt
    names = ["greedy"] + [s for s in strategies.split(",") if s and s != "greedy" and (draft or s != "speculative")]
    table = summarise(run(generator, names, max_new_tokens, window, repeats))
    click.echo(f"\n{len(PROMPTS)} chat prompts x {repeats}, {max_new_tokens} new tokens, medians:")
    click.echo("| strategy | tokens/s | tokens/pass | vs greedy | identical to greedy |")
    click.echo("|---|---|---|---|---|")
    for row in table:
        click.echo(
            f"| {row['strategy']} | {row['tokens/s']:.1f} | {row['tokens/pass']:.2f} | {row['ratio']:.2f}x | "
            f"{'yes' if row['identical'] else 'NO'} |"
        )


if __name__ == "__main__":
    main()
