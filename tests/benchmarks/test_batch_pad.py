"""benchmarks/batch_pad.py: both arms run on every artifact, and each says whether its rows equal lone greedy."""

from __future__ import annotations

import json

from click.testing import CliRunner
from make_artifacts import TINY_GGUF

from benchmarks.batch_pad import main


def test_each_artifact_gets_both_arms_and_the_lone_greedy_comparison(artifact, tmp_path):
    out = tmp_path / "rows.json"
    folders = [str(artifact(TINY_GGUF)), str(artifact("llama"))]
    result = CliRunner().invoke(
        main, [*folders, "--rows", "2", "--rounds", "2", "--max-tokens", "6", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["artifact"] for r in rows] == [TINY_GGUF, "llama"]
    for row in rows:
        assert row["identical_to_lone_greedy"] is True
        assert [len(v) for v in row["rounds"].values()] == [2, 2] and row["padded_tok_s"] > 0 < row["runtime_tok_s"]
    assert rows[0]["extra_row"] and rows[1]["extra_row"]  # level 4 and float graphs both have the extra row
    assert [line.split(" | ")[0] for line in result.stdout.splitlines()[2:]] == [f"| {TINY_GGUF}", "| llama"]
