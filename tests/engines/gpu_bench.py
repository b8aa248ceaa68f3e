"""The GPU benchmark of scripts/gpu_check.sh: SmolLM2-135M, greedy vs jacobi vs lookahead vs speculative,
on TensorRT, onnxruntime CUDA, and onnxruntime CPU for comparison; a short table last.

    python tests/engines/gpu_bench.py --artifacts build/test-artifacts --engines build/gpu-check

Every figure is measured side by side in this one run: decode tokens/s (new tokens after the
first, over wall time after the prefill), the ratio to greedy on the same backend, tokens per
target pass, and whether the ids equal greedy's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain what a hash table is and when to use one."}],
    [
        {
            "role": "user",
            "content": "Summarise in two sentences: The Jacobi method solves a system of equations by "
            "guessing every unknown at once and refining all the guesses together until they stop changing.",
        }
    ],
    "def quicksort(items):\n",
]
GPU_STRATEGIES = ["greedy", "jacobi", "lookahead", "speculative"]
CPU_STRATEGIES = ["greedy", "lookahead"]


def run(gen, strategy: str, new_tokens: int) -> dict:
    ids, tokens, passes, decode_seconds = [], 0, 0, 0.0
    for prompt in PROMPTS:
        request = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
        result = gen.generate(max_new_tokens=new_tokens, strategy=strategy, **request)
        s = result.stats
        ids.append(result.ids)
        tokens += s.new_tokens - 1  # the prefill's token is not a decoding token
        passes += s.target_passes
        decode_seconds += s.wall_seconds - s.prefill_seconds
    return {
        "strategy": strategy,
        "ids": ids,
        "tokens_per_second": tokens / decode_seconds,
        "tokens_per_pass": tokens / max(passes, 1),
    }


def bench(name: str, gen, strategies: list[str], new_tokens: int) -> list[dict]:
    gen.generate("Warm up", max_new_tokens=8, strategy="greedy")  # first-pass costs (kernels, allocations)
    rows = [run(gen, s, new_tokens) for s in strategies]
    greedy = rows[0]
    for row in rows:
        row.update(
            backend=name, ratio=row["tokens_per_second"] / greedy["tokens_per_second"], same=row["ids"] == greedy["ids"]
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'backend':<18} {'strategy':<12} {'tokens/s':>9} {'x greedy':>9} {'tok/pass':>9}  same ids"]
    for r in rows:
        lines.append(
            f"{r['backend']:<18} {r['strategy']:<12} {r['tokens_per_second']:9.1f} {r['ratio']:9.2f} "
            f"{r['tokens_per_pass']:9.2f}  {'yes' if r['same'] else 'NO'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from gpu_helpers import engine_artifact, ort_cuda_missing, tensorrt_missing

    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.backends.onnxrt import physical_cores

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--artifacts", type=Path, default=Path(os.environ.get("JACOBI_RT_TEST_ARTIFACTS", "build/test-artifacts"))
    )
    parser.add_argument("--engines", type=Path, default=Path("build/gpu-check"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    target, draft = args.artifacts / "smollm2-135m", args.artifacts / "smollm2-135m-draft6"
    rows, notes = [], []
    if (reason := tensorrt_missing()) is None:
        engines = args.engines / "fp16"
        gen = Generator.load(
            engine_artifact(target, engines, "fp16"), draft=engine_artifact(draft, engines, "fp16"), backend="tensorrt"
        )
        rows += bench("tensorrt-fp16", gen, GPU_STRATEGIES, args.new_tokens)
    else:
        notes.append(f"TensorRT skipped: {reason}")
    if (reason := ort_cuda_missing()) is None:
        gen = Generator.load(target, draft=draft, backend="cuda")
        rows += bench("onnxruntime-cuda", gen, GPU_STRATEGIES, args.new_tokens)
    else:
        notes.append(f"onnxruntime CUDA skipped: {reason}")
    cpu = Generator.load(target, backend="cpu", threads=physical_cores())
    rows += bench(f"onnxruntime-cpu{physical_cores()}", cpu, CPU_STRATEGIES, args.new_tokens)
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "ids"} for r in rows], indent=2))
    print("\n".join(notes))
    print(f"SmolLM2-135M, {len(PROMPTS)} prompts x {args.new_tokens} new tokens, decode tokens/s (after the prefill)")
    print(table(rows))
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
