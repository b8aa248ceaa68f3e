"""Each prompt's window widths, pass by pass, for one strategy: compares two versions' decisions
(run it under each, e.g. with PYTHONPATH pointing at an older checkout's package) without timing noise.

    python -m benchmarks.decision_trace ARTIFACT --strategy lookahead --no-learn --limit 6 -n 64

Prints per prompt: target passes, guesses proposed, a hash of the width sequence and the tokens the
passes computed (auto: and its passes per arm). --no-learn keeps the pass-cost tables (no measured
timings): the decisions are then deterministic, so equal hashes mean equal decisions.
"""

from __future__ import annotations

import argparse
import hashlib
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--strategy", default="lookahead")
    parser.add_argument("--draft", help="a draft artifact (speculative, auto)")
    parser.add_argument("--no-learn", action="store_true", help="keep the cost tables: deterministic decisions")
    parser.add_argument("--limit", type=int, default=6)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from jacobi_rt.runtime import Generator, acceptance, decoding
    from jacobi_rt.tools import bench

    if args.no_learn:
        acceptance.PassCosts.observe = lambda self, width, seconds, rows=1: None
    widths: list[int] = []
    build = decoding.build_tree

    def recorded(*a, **k):
        tree = build(*a, **k)
        widths.append(len(tree.tokens))
        return tree

    decoding.build_tree = recorded  # the loop's own module global: every pass goes through it
    gen = Generator.load(args.artifact, draft=args.draft, threads=args.threads, verify=False, prefix_cache=False)
    for prompt in bench.load_prompts(None, args.limit):
        widths.clear()
        result = gen.generate(bench.prompt_ids(gen, prompt), max_new_tokens=args.max_new_tokens, strategy=args.strategy)
        digest = hashlib.md5(json.dumps(widths).encode()).hexdigest()[:8]
        arms = result.stats.proposer.get("passes_by_arm")  # auto: target passes per arm
        print(
            prompt.id,
            result.stats.target_passes,
            result.stats.proposer.get("proposed"),
            digest,
            sum(widths),
            *([json.dumps(arms, separators=(",", ":"))] if arms else []),
        )


if __name__ == "__main__":
    main()
