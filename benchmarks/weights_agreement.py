"""How closely an artifact on quantized weights follows the float one: greedy agreement on the bench prompts.

    python -m benchmarks.weights_agreement build/smollm2-135m build/smollm2-135m-gguf --new-tokens 128

For each prompt the REFERENCE artifact decodes greedily; then both graphs read that same
sequence in one pass and their argmax is compared at every generated position (teacher-forced
agreement, with the reference's top-2 gap where they differ: small gaps are near-ties). The
CANDIDATE also decodes freely: identical outputs and the first position where they part.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

PROMPTS = Path(__file__).resolve().parents[1] / "tools" / "data" / "prompts.jsonl"  # the bench set


def load_prompts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def session(folder: Path, threads: int):
    import onnxruntime as ort

    from jacobi_rt.runtime.manifest import load_manifest

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    graph = folder / load_manifest(folder, verify=False).graphs["portable"]
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def logits_of(sess, ids: list[int]) -> np.ndarray:
    """One pass over the whole sequence from an empty cache: logits [len, vocab]."""
    n = len(ids)
    feeds = {
        "input_ids": np.array([ids], np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
        "attention_mask": np.ones((1, n), np.int64),
        "window_mask": np.tril(np.ones((n, n), bool))[None],
    }
    for value in sess.get_inputs():
        if value.name.startswith("past_key_values"):
            shape = [1, value.shape[1], 0, value.shape[3]]
            feeds[value.name] = np.zeros(shape, np.float16 if "float16" in value.type else np.float32)
    return sess.run(["logits"], feeds)[0][0]


def compare(reference: Path, candidate: Path, prompts: list[dict], new_tokens: int, threads: int) -> dict:
    from jacobi_rt.runtime import Generator

    ref_gen = Generator.load(reference, threads=threads, prefix_cache=False)
    cand_gen = Generator.load(candidate, threads=threads, prefix_cache=False)
    ref_sess, cand_sess = session(reference, threads), session(candidate, threads)
    agree = total = identical = 0
    rows = []
    for p in prompts:
        kwargs = {"chat": bool(p.get("chat")), "strategy": "greedy", "max_new_tokens": new_tokens}
        ref = ref_gen.generate(p["prompt"], **kwargs)
        cand = cand_gen.generate(p["prompt"], **kwargs)
        prompt_ids = (
            ref_gen.tokenizer.encode(
                ref_gen.chat_prompt([{"role": "user", "content": p["prompt"]}]), add_special_tokens=False
            )
            if p.get("chat")
            else ref_gen.tokenizer.encode(p["prompt"])
        )
        sequence = prompt_ids + ref.ids
        start = len(prompt_ids) - 1  # the logits at start predict the first generated token
        r, c = logits_of(ref_sess, sequence)[start:-1], logits_of(cand_sess, sequence)[start:-1]
        ra, ca = r.argmax(-1), c.argmax(-1)
        differ = np.nonzero(ra != ca)[0]
        top2 = np.sort(r[differ], axis=-1)[:, -2:] if len(differ) else np.zeros((0, 2))
        agree += int((ra == ca).sum())
        total += len(ra)
        identical += ref.ids == cand.ids
        parted = next((i for i, (a, b) in enumerate(zip(ref.ids, cand.ids)) if a != b), None)
        rows.append(
            {
                "id": p["id"],
                "positions": len(ra),
                "agree": int((ra == ca).sum()),
                "identical": ref.ids == cand.ids,
                "first_divergence": parted,
                "gaps_where_differ": [round(float(g[1] - g[0]), 3) for g in top2],
            }
        )
    return {
        "reference": str(reference),
        "candidate": str(candidate),
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "teacher_forced_agreement": round(agree / max(total, 1), 4),
        "positions": total,
        "identical_outputs": identical,
        "per_prompt": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the full report here")
    args = parser.parse_args()
    prompts = load_prompts(args.prompts)[: args.limit]
    report = compare(args.reference, args.candidate, prompts, args.new_tokens, args.threads)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(
        f"{args.candidate} vs {args.reference}: greedy argmax agrees on {report['teacher_forced_agreement']:.1%} of "
        f"{report['positions']} generated positions (teacher-forced); identical outputs on "
        f"{report['identical_outputs']}/{report['prompts']} prompts"
    )
    for row in report["per_prompt"]:
        print(
            f"  {row['id']:10} agree {row['agree']}/{row['positions']}  first divergence {row['first_divergence']}  "
            f"top-2 gaps where they differ {row['gaps_where_differ'][:5]}"
        )


if __name__ == "__main__":
    main()
