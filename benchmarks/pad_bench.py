"""What the pad row of runtime/backends/exact_rows.py costs on this CPU: each strategy with passes as they
come and with one-row passes padded to two rows, side by side.

    python -m benchmarks.pad_bench build/smollm2-135m-gguf --strategies greedy,lookahead,auto --prompts 8 --threads 2

Two generators over one artifact, loaded at once: one in the mode the load-time check picked, one with
`pad_rows` forced on; each prompt runs on both in turn (the order alternating), so machine noise hits
both alike. Reports tokens/s per strategy and mode (median over prompts), the padded/native ratio, and
whether each output equals the same mode's greedy. On a CPU where the check picks `padded` this
compares padded with padded (the check's mode is what runs); on one where it picks `native`, it
measures what padding would cost here. A tool, not a test.
"""

from __future__ import annotations

import statistics

import click


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--strategies", default="greedy,lookahead,auto", show_default=True, help="Comma-separated strategies.")
@click.option(
    "--prompts", "limit", type=int, default=8, show_default=True, help="How many of the bundled bench prompts."
)
@click.option("--new-tokens", type=int, default=128, show_default=True)
@click.option("--threads", type=int, default=None, help="Default: the physical cores.")
def main(artifact, strategies, limit, new_tokens, threads):
    """Tokens/s of each strategy with and without the pad row, and each output's identity to its mode's greedy."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.backends.exact_rows import cpu
    from jacobi_rt.tools.bench import load_prompts, prompt_ids

    modes = {
        "checked": Generator.load(artifact, threads=threads, verify=False, prefix_cache=False),
        "padded": Generator.load(artifact, threads=threads, verify=False, prefix_cache=False),
    }
    modes["padded"].backend.pad_rows = True
    names = ["greedy"] + [s.strip() for s in strategies.split(",") if s.strip() not in ("", "greedy")]  # greedy first
    rates = {(m, s): [] for m in modes for s in names}
    identical = {(m, s): 0 for m in modes for s in names}
    same_greedy = (
        0  # prompts whose greedy output is the same in both modes (on a `native` CPU: the pad changes nothing)
    )
    prompts = load_prompts(limit=limit)
    for i, prompt in enumerate(prompts):
        ids = prompt_ids(modes["checked"], prompt)
        greedy = {}
        for mode in list(modes) if i % 2 == 0 else list(modes)[::-1]:
            for strategy in names:
                result = modes[mode].generate(ids, max_new_tokens=new_tokens, strategy=strategy)
                rates[mode, strategy].append(result.stats.decode_tokens_per_second)
                greedy.setdefault(mode, result.ids)  # greedy runs first
                identical[mode, strategy] += result.ids == greedy[mode]
        same_greedy += greedy["checked"] == greedy["padded"]
    checked = modes["checked"].backend.rows.mode
    click.echo(f"{artifact} on {cpu()}, {modes['checked'].backend.threads} threads; the check picked {checked!r}")
    click.echo(f"{len(prompts)} prompts x up to {new_tokens} new tokens; decode tokens/s, median")
    click.echo("| strategy | checked mode | padded | padded / checked | identical to greedy (checked, padded) |")
    click.echo("|---|---|---|---|---|")
    for s in names:
        a, b = statistics.median(rates["checked", s]), statistics.median(rates["padded", s])
        ratios = statistics.median(y / x for x, y in zip(rates["checked", s], rates["padded", s]))
        click.echo(
            f"| {s} | {a:.1f} | {b:.1f} | {ratios:.3f} | {identical['checked', s]}/{len(prompts)}, "
            f"{identical['padded', s]}/{len(prompts)} |"
        )
    click.echo(f"greedy identical in both modes: {same_greedy}/{len(prompts)}")


if __name__ == "__main__":
    main()
