"""onnxruntime-genai's own decode loop against the same graph driven from Python, kernel by kernel.

    python -m benchmarks.peer_loop build/ortgenai-int4 --tokens 200 --threads 2

Why: genai's int4 greedy decodes faster than the same model.onnx run from Python, with the same
session options and IO binding (the KV cache bound as past and present, as genai binds it), and its
kernels are not all the same speed in the two loops. Both runs go through onnxruntime's profiler:
genai's through its config (`session_options.enable_profiling`), the Python loop through
SessionOptions; the table is op_profile's (kernel ms per pass by op type, model_run per pass), plus the
median gap between one pass's end and the next one's start. The Python side feeds what genai feeds:
`input_ids` [1, 1] and a growing `attention_mask`, the past at the prompt's length. A tool, not a test.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import statistics
import tempfile
from pathlib import Path

import click
import numpy as np

from benchmarks.op_profile import summarise, table

PROMPT = "The history of the Roman Empire began"  # plain text, no chat template: decoding rarely stops early
SKIPPED = 20  # at least the load-time check's passes (runtime/backends/exact_rows.py), the prompt and a warm-up


def genai_events(folder: Path, tokens: int, threads: int, tmp: str) -> tuple[list[dict], int]:
    """genai's greedy loop over `tokens` tokens, profiled; returns the trace and the prompt's length."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    session = {"intra_op_num_threads": threads, "enable_profiling": os.path.join(tmp, "genai")}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
    model = og.Model(config)
    ids = og.Tokenizer(model).encode(PROMPT)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + tokens + 8, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    for _ in range(tokens):
        generator.generate_next_token()
    del generator, params, model  # genai writes the trace when the session goes
    gc.collect()
    return json.loads(Path(glob.glob(os.path.join(tmp, "genai*.json"))[0]).read_text()), len(ids)


def python_events(folder: Path, past: int, tokens: int, threads: int, tmp: str) -> list[dict]:
    """The same model.onnx from Python with the runtime's session options, the cache bound in place."""
    import onnxruntime as ort

    from jacobi_rt.runtime.backends.ort_session import session_options

    options = session_options(ort, threads)
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tmp, "python")
    session = ort.InferenceSession(str(folder / "model.onnx"), sess_options=options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    capacity = past + tokens + 8
    head_size = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    kv = {}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            shape = [1, i.shape[1], capacity, head_size]
            kv[i.name] = ort.OrtValue.ortvalue_from_numpy(
                np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
            )
            binding.bind_ortvalue_input(i.name, kv[i.name])
            binding.bind_ortvalue_output(i.name.replace("past_key_values", "present"), kv[i.name])
    binding.bind_output("logits")
    for step in range(tokens):
        binding.bind_cpu_input("input_ids", np.array([[7]], np.int64))
        binding.bind_cpu_input("attention_mask", np.ones((1, past + step + 1), np.int64))
        session.run_with_iobinding(binding)
    return json.loads(Path(session.end_profiling()).read_text())


def jacobi_rt_events(artifact: Path, tokens: int, threads: int, tmp: str) -> list[dict]:
    """jacobi-rt's greedy on `artifact` (its own graph choice and binding), the session profiled: the runtime's
    session options with onnxruntime's profiler switched on."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.backends import onnxrt

    plain = onnxrt.session_options

    def profiled(ort, threads):
        options = plain(ort, threads)
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "jacobi-rt")
        return options

    onnxrt.session_options = profiled
    try:
        generator = Generator.load(artifact, threads=threads, prefix_cache=False)
    finally:
        onnxrt.session_options = plain
    generator.generate(PROMPT, tokens, strategy="greedy")
    return json.loads(Path(generator.backend.session.end_profiling()).read_text())


def passes(events: list[dict]) -> int:
    return sum(e.get("name") == "model_run" for e in events)


def gap_ms(events: list[dict]) -> float:
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[SKIPPED:]
    return statistics.median(b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(runs, runs[1:])) / 1000


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--tokens", type=click.IntRange(20), default=200, show_default=True, help="Decode passes per loop.")
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True)
@click.option(
    "--artifact",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Also profile jacobi-rt's greedy on this artifact of the same model (the same prompt text).",
)
def main(folder: Path, tokens: int, threads: int, artifact: Path | None) -> None:
    """FOLDER: an onnxruntime-genai model folder (python -m jacobi_rt.tools.peers prepare)."""
    with tempfile.TemporaryDirectory() as tmp:
        genai, prompt = genai_events(folder, tokens, threads, tmp)
        traces = {"genai loop": genai, "Python loop": python_events(folder, prompt, tokens, threads, tmp)}
        if artifact:
            traces[f"jacobi-rt {artifact.name}"] = jacobi_rt_events(artifact, tokens, threads, tmp)
    # the last `runs` passes of each: past the prompt's pass, jacobi-rt's load-time exact-rows check, the warm-up
    runs = min(passes(events) for events in traces.values()) - SKIPPED
    if runs < 10:
        raise click.ClickException(f"only {runs + SKIPPED} passes in the shortest loop: ask for more --tokens")
    profiles = [summarise(events, passes(events) - runs, runs, name) for name, events in traces.items()]
    print(f"{folder.name}: {tokens} tokens after a {prompt}-token prompt, {threads} thread(s), ms per pass")
    print(table(profiles))
    print("| gap between passes | " + " | ".join(f"{gap_ms(e):.2f} | " for e in traces.values()) + " |")


if __name__ == "__main__":
    main()
