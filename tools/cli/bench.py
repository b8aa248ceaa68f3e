"""`jacobi-rt bench`: jacobi-rt strategies and the peers over one prompt set, side by side."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import click

from .decoding import decoding_config, decoding_option

DEFAULT_STRATEGIES = "greedy,jacobi,lookahead,auto"


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


@click.command("bench")
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--draft",
    "-d",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="A draft artifact: adds the 'speculative' strategy's model (and auto uses it).",
)
@click.option(
    "--prompts",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help='JSONL prompts ({"id", "category", "prompt", "chat"}). Default: the bundled 30.',
)
@click.option(
    "--also",
    "also",
    type=click.Path(exists=True, file_okay=False),
    multiple=True,
    help="Another artifact of the same model (e.g. its GGUF-weights export) to run side by side: its "
    "strategies appear as NAME/STRATEGY, compared with its own greedy and with ARTIFACT's. Repeatable.",
)
@click.option(
    "--strategies",
    default=DEFAULT_STRATEGIES,
    show_default=True,
    help="Comma-separated jacobi-rt strategies; greedy is always run (it is the reference). Also "
    "speculative-chain and speculative-tail: speculative without and with the Jacobi tail.",
)
@click.option(
    "--temperature",
    "-t",
    "temperatures",
    type=click.FloatRange(0),
    multiple=True,
    help="Sample at this temperature (repeatable: each strategy runs at each, named STRATEGY@T, and is compared "
    "with greedy@T, plain one-token-per-pass sampling with the same seed). Default: 0 (greedy) only. Also "
    "speculative-independent: speculative with the draft's own noise instead of the target's (coupled).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="The sampling seed of every run.")
@click.option("--window", "-w", type=click.IntRange(1, 64), default=None, help="Widest pass; default: the runtime's.")
@click.option(
    "--peers",
    default="",
    show_default=True,
    help=(
        "Comma-separated peers: hf, hf-lookup, ortgenai, ortgenai-ngram, ortgenai-int4, ortgenai-int4-ngram, "
        "llamacpp, llamacpp-lookup, openvino, openvino-lookup."
    ),
)
@click.option(
    "--peer-models",
    type=click.Path(file_okay=False),
    default="build",
    show_default=True,
    help="Folder with ortgenai-fp32/ and ortgenai-int4/ (python -m jacobi_rt.tools.peers prepare --out DIR).",
)
@click.option(
    "--hf-model",
    default=None,
    help=(
        "Source model for the hf peers (HF folder or .gguf) and the llamacpp and openvino peers (.gguf). "
        "Default: the embedded SmolLM2 GGUF."
    ),
)
@click.option("--max-new-tokens", "-n", type=click.IntRange(1), default=128, show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@click.option(
    "--threads", type=click.IntRange(1), default=None, help="CPU threads for every engine. Default: physical cores."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="build/bench",
    show_default=True,
    help="Where bench.json and the PNG plots go.",
)
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@decoding_option
def bench_command(
    artifact,
    draft,
    also,
    prompts,
    strategies,
    temperatures,
    seed,
    window,
    peers,
    peer_models,
    hf_model,
    max_new_tokens,
    repeats,
    limit,
    threads,
    out,
    no_plots,
    decoding,
):
    """Benchmark ARTIFACT's strategies (and peers) on the same prompts, interleaved.

    Reports per configuration the median and p25-p75 of tokens per target pass, decode tokens/s, the
    per-prompt ratio to jacobi-rt greedy, time to first token, the process's peak RSS, and whether
    every output is token-identical to greedy (else where it first differs and greedy's top-2 logit
    gap there). Writes OUT/bench.json (every raw measurement) and PNG plots.

    \b
    Example:
      jacobi-rt bench build/smollm2-135m --peers hf,ortgenai,ortgenai-ngram --limit 10 -n 64
    """
    from tqdm import tqdm

    from jacobi_rt import __version__
    from jacobi_rt.runtime import InputError
    from jacobi_rt.runtime.backends.exact_rows import cpu
    from jacobi_rt.runtime.config import DEFAULTS, changed_fields
    from jacobi_rt.runtime.params import STRATEGIES

    from .. import bench, bench_plots
    from .. import peers as peer_registry

    started = time.perf_counter()
    names = ["greedy"] + [s for s in _names(strategies) if s != "greedy"]
    unknown = [s for s in names if bench.strategy_of(s)[0] not in STRATEGIES]
    if unknown:
        raise InputError(f"unknown strategy {unknown[0]!r}; pick from {', '.join([*STRATEGIES, *bench.VARIANTS])}")
    if any(bench.strategy_of(s)[0] == "speculative" for s in names) and draft is None:
        raise InputError("strategy 'speculative' needs --draft DIR (a draft artifact)")
    prompt_set = bench.load_prompts(prompts, limit)
    if not prompt_set:
        raise InputError("no prompts to run")

    config = decoding_config(decoding)  # every jacobi-rt artifact of the run decodes with it
    generator = bench.load_generator(artifact, draft=draft, threads=threads, config=config)
    engine = f"jacobi-rt:{Path(artifact).name}"
    configs = [
        bench.StrategyConfig(
            generator,
            bench.strategy_of(s)[0],
            None if s == "greedy" else window,
            bench.sampled(s, t),
            engine,
            bench.sampled("greedy", t),
            {**bench.strategy_of(s)[1], **({"temperature": t, "seed": seed} if t else {})},
        )
        for t in (temperatures or (0.0,))
        for s in names
    ]
    other_gaps = {}
    for other in also:  # same strategies on another artifact; the draft belongs to ARTIFACT, so no speculative here
        label = Path(other).name
        extra = bench.load_generator(other, threads=threads, config=config)
        other_gaps[f"{label}/greedy"] = lambda pid, prefix, g=extra: bench.greedy_logit_gap(g, ids[pid], prefix)
        configs += [
            bench.StrategyConfig(
                extra, s, None if s == "greedy" else window, f"{label}/{s}", f"jacobi-rt:{label}", f"{label}/greedy"
            )
            for s in names
            if bench.strategy_of(s)[0] != "speculative"
        ]
    ctx = peer_registry.PeerContext(
        Path(artifact), Path(peer_models), threads, hf_model, tuple(generator.manifest.tokens.eos_ids)
    )
    peer_configs, skipped = peer_registry.load_peers(_names(peers), ctx)
    for line in skipped:
        click.secho(line, fg="yellow", err=True)
    configs += peer_configs
    ids = {p.id: bench.prompt_ids(generator, p) for p in prompt_set}

    total = repeats * len(prompt_set) * len(configs)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr) as bar:

        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        records = bench.run_bench(configs, prompt_set, ids, max_new_tokens, repeats, progress=step)

    own = {
        c.name: c.baseline
        for c in configs
        if c.engine.startswith("jacobi-rt:") and c.baseline != c.name and (c.engine != engine or c.baseline != "greedy")
    }  # other artifacts, and sampling against plain sampling
    bench.mark_identity(
        records,
        logit_gap=lambda pid, prefix: bench.greedy_logit_gap(generator, ids[pid], prefix),
        references=own,
        other_gaps=other_gaps,
    )
    summary = bench.summarise(records, {c.name: c.baseline for c in configs})
    meta = {
        "jacobi_rt_version": __version__,
        "artifact": str(artifact),
        "draft": draft,
        "decoding": {k: v for k, v in changed_fields(DEFAULTS, config).items()},  # the --decoding fields
        "quantization": generator.manifest.quantization,
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "prompts": len(prompt_set),
        "threads": threads or generator.backend.threads,
        "configs": [{"name": c.name, "engine": c.engine, "baseline": c.baseline} for c in configs],
        "skipped_peers": skipped,
        "machine": platform.platform(),
        "cpu": cpu(),
        "exactness": generator.backend.rows.mode,
        "python": platform.python_version(),
        "memory_note": "rss_peak_mb: peak resident memory of the one shared process during each run (all engines "
        "loaded), sampled from /proc/self/statm every 5 ms; rss_added_mb: peak minus RSS at the run's start",
        "seconds": None,
    }
    out = Path(out)
    click.echo(
        f"\n{len(prompt_set)} prompts x {repeats}, up to {max_new_tokens} new tokens on {meta['cpu']}, "
        f"{meta['threads']} threads; median (p25-p75):"
    )
    click.echo(bench.markdown(summary))
    for line in bench.divergence_lines(summary):
        click.echo(f"  {line}")
    if not no_plots:
        reason = bench_plots.available()
        if reason:
            click.secho(f"plots skipped: {reason}", fg="yellow", err=True)
        else:
            for path in bench_plots.plot_all(records, out):
                click.echo(f"plot: {path}")
    meta["seconds"] = round(time.perf_counter() - started, 1)
    path = bench.write_outputs(out, bench.report_json(summary, records, meta))
    click.echo(f"raw measurements: {path} ({meta['seconds']:.0f} s)")
