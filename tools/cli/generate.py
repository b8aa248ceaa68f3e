"""`jacobi-rt generate`: run an exported artifact on a prompt with any decoding strategy."""

from __future__ import annotations

import json
import sys

import click

from jacobi_rt.runtime.params import STRATEGIES

from .constraints import constraint_options
from .decoding import decoding_config, decoding_option
from .verifying import mapped_option, verify_mode, verify_options


@click.command("generate")
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--prompt", "-p", default=None, help="Text to continue. Use '-' to read it from stdin.")
@click.option(
    "--chat", "-c", default=None, help="A user message, wrapped in the model's chat template (for instruct models)."
)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGIES),
    default="auto",
    show_default=True,
    help="How guesses are made (the output is the same): greedy = one token per pass; jacobi = the last pass's "
    "predictions; lookahead = n-grams from the prompt, the output and the Jacobi trajectories; speculative = "
    "the --draft model; auto = the best of these, sending guesses only when they pay.",
)
@click.option(
    "--draft",
    "-d",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="A draft artifact (`jacobi-rt export MODEL --role draft`) with the same vocabulary, for speculative/auto.",
)
@click.option(
    "--window",
    "-w",
    type=click.IntRange(1, 64),
    default=None,
    help=(
        "Widest pass, in tokens (last token + guesses). Default: adaptive up to 8 for jacobi, up to 16 for the others."
    ),
)
@click.option(
    "--max-new-tokens",
    "-n",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Most tokens to generate.",
)
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable); the text is cut before it.")
@click.option("--stream/--no-stream", default=False, help="Print text as it is generated.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: ids, text and stats (passes, tokens per pass, timings).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "cpu", "cuda", "tensorrt"]),
    default="auto",
    show_default=True,
    help="auto: onnxruntime on CUDA when onnxruntime-gpu and a GPU are present, else CPU. "
    "tensorrt: the artifact's engine from `jacobi-rt build` (draft too).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads for onnxruntime. Default: the physical cores.",
)
@click.option(
    "--graph",
    type=click.Choice(["auto", "inplace", "portable"]),
    default="auto",
    show_default=True,
    help="onnxruntime graph variant: the in-place KV cache (CPU default when the artifact has it) or the portable one.",
)
@mapped_option
@click.option(
    "--jacobi-tail/--no-jacobi-tail",
    default=None,
    help="speculative (and auto's draft arm): the target's predictions past a rejected guess seed the draft's "
    "next window (speculative Jacobi decoding). Default: the runtime's (see the README).",
)
@click.option(
    "--temperature",
    "-t",
    type=float,
    default=0.0,
    show_default=True,
    help="0: greedy. Above 0: sample from softmax(logits / T); every strategy gives the same text for a --seed.",
)
@click.option(
    "--top-k", type=int, default=0, show_default=True, help="Sample from the k most likely tokens only (0: all)."
)
@click.option(
    "--top-p",
    type=float,
    default=1.0,
    show_default=True,
    help="Sample from the smallest set holding this probability (1: all).",
)
@click.option(
    "--min-p",
    type=float,
    default=0.0,
    show_default=True,
    help="Drop tokens less likely than this times the top token (0: none).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Sampling seed (the same seed gives the same text). Default: drawn, and printed with the stats.",
)
@click.option(
    "--repetition-penalty",
    type=float,
    default=1.0,
    show_default=True,
    help="Divide the logits of tokens already in the prompt or output (1: none).",
)
@verify_options
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also print to stderr what was loaded: the backend, graph and threads, and how "
    "this CPU keeps every strategy's output equal to greedy's (the load-time exactness check).",
)
@decoding_option
@constraint_options
def generate_command(
    artifact,
    prompt,
    chat,
    strategy,
    draft,
    window,
    max_new_tokens,
    stop,
    stream,
    as_json,
    backend,
    threads,
    graph,
    mapped,
    jacobi_tail,
    temperature,
    top_k,
    top_p,
    min_p,
    seed,
    repetition_penalty,
    verify,
    no_verify,
    verbose,
    decoding,
    constraint,
):
    """Generate text with the artifact folder ARTIFACT (written by `jacobi-rt export`).

    The output is token-for-token the model's greedy output (or, with --temperature, the same
    sample for a --seed), whichever strategy you pick; the strategies differ only in speed. Stats go
    to stderr (or into --json).

    \b
    Examples:
      jacobi-rt generate build/smollm2-135m --chat "Write a haiku about autumn"
      jacobi-rt generate build/smollm2-135m --prompt "def fib(n):" -n 64 --stream
      echo "Once upon a time" | jacobi-rt generate build/smollm2-135m --prompt - --json
      jacobi-rt generate build/smollm2-135m --chat "Name a color" --temperature 0.7 --top-p 0.9 --seed 1
      jacobi-rt generate build/smollm2-135m --chat "Extract: Ann, 31, Oslo" --json-schema person.json
    """
    from jacobi_rt.runtime import Generator, InputError
    from jacobi_rt.runtime.params import GenerationParams
    from jacobi_rt.runtime.sampling import SamplingParams

    if (prompt is None) == (chat is None):
        raise InputError("pass exactly one of --prompt TEXT (or --prompt - for stdin) and --chat MESSAGE")
    text = prompt if prompt is not None else chat
    if text == "-":
        text = sys.stdin.read()
    if stream and as_json:
        raise InputError("--stream and --json do not mix; pick one")
    config = decoding_config(decoding)
    generator = Generator.load(
        artifact,
        draft=draft,
        backend=backend,
        threads=threads,
        verify=verify_mode(verify, no_verify),
        graph=graph,
        config=config,
        mapped=mapped,
    )
    if verbose:
        loaded = generator.backend
        click.echo(
            f"loaded {artifact}: {loaded.name}, {getattr(loaded, 'graph', 'engine')} graph, "
            f"{getattr(loaded, 'threads', '-')} threads, session from {getattr(loaded, 'session_graph', 'the engine')}",
            err=True,
        )
        click.echo(loaded.rows.line(), err=True)
    sampling = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, repetition_penalty=repetition_penalty
    )
    params = GenerationParams(
        max_new_tokens, strategy, window, tuple(stop), jacobi_tail, sampling, constraint=constraint
    )
    options = dict(params=params, chat=chat is not None)
    if stream:
        for piece in generator.stream(text, **options):
            click.echo(piece, nl=False)
            sys.stdout.flush()
        click.echo()
        return
    result = generator.generate(text, **options)
    if as_json:
        click.echo(json.dumps(result.to_dict(), ensure_ascii=False))
        return
    click.echo(result.text)
    s = result.stats
    click.echo(
        f"[{s.new_tokens} tokens, {s.strategy} window {'up to ' if s.adaptive else ''}{s.window}: "
        f"{s.target_passes} passes, "
        f"{s.tokens_per_pass:.2f} tokens/pass, {s.decode_tokens_per_second:.1f} tokens/s, finish: {s.finish_reason}"
        f"{'' if s.seed is None else f', seed {s.seed}'}]",
        err=True,
    )
