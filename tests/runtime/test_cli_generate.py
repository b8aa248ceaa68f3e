"""`jacobi-rt generate` end to end through click."""

from __future__ import annotations

import json

from click.testing import CliRunner

from jacobi_rt.tools.cli.main import cli


def run(*args, input=None):
    return CliRunner().invoke(cli, ["generate", *map(str, args)], input=input)


def test_json_output_equals_the_api(artifact, generator):
    folder = artifact("llama")
    result = run(folder, "--prompt", "The quick brown fox", "-n", "12", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = generator("llama").generate("The quick brown fox", max_new_tokens=12, strategy="greedy")
    assert data["ids"] == expected.ids and data["text"] == expected.text
    assert data["stats"]["strategy"] == "auto" and data["stats"]["new_tokens"] == 12


def test_stdin_stream_and_chat(artifact, generator):
    folder = artifact("llama")
    gen = generator("llama")
    streamed = run(folder, "--prompt", "-", "-n", "10", "--stream", "--strategy", "greedy", input="café 東京")
    assert streamed.exit_code == 0 and streamed.stdout == gen.generate("café 東京", 10).text + "\n"
    chat = run(folder, "--chat", "Hi", "-n", "5", "--json", "--threads", "1")
    assert json.loads(chat.stdout)["ids"] == gen.generate("Hi", chat=True, max_new_tokens=5).ids


def test_errors_are_one_line_and_exit_1(artifact, tmp_path):
    folder = artifact("llama")
    for args in (
        [folder, "--prompt", ""],
        [folder],
        [folder, "--prompt", "x", "--chat", "y"],
        [tmp_path, "--prompt", "x"],
    ):
        result = run(*args)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("error: ") and "Traceback" not in result.output


def test_jacobi_tail_option_reaches_the_draft(artifact):
    folder, draft = artifact("llama"), artifact("llama-draft1")
    base = [
        folder,
        "--draft",
        draft,
        "--prompt",
        "The quick brown fox",
        "-n",
        "12",
        "--json",
        "--strategy",
        "speculative",
    ]
    greedy = json.loads(
        run(folder, "--prompt", "The quick brown fox", "-n", "12", "--json", "--strategy", "greedy").stdout
    )
    for flag, expected in (("--jacobi-tail", True), ("--no-jacobi-tail", False)):
        result = run(*base, flag)
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["ids"] == greedy["ids"] and data["stats"]["proposer"]["jacobi_tail"] is expected
    refused = run(folder, "--prompt", "x", "--strategy", "lookahead", "--jacobi-tail")
    assert refused.exit_code == 1 and "jacobi_tail" in refused.output


def test_sampling_options_reach_the_sampler(artifact, generator):
    folder = artifact("llama")
    args = [
        folder,
        "--prompt",
        "The quick brown fox",
        "-n",
        "12",
        "--json",
        "--strategy",
        "jacobi",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--min-p",
        "0.01",
        "--seed",
        "4",
        "--repetition-penalty",
        "1.1",
    ]
    data = json.loads(run(*args).stdout)
    expected = generator("llama").generate(
        "The quick brown fox",
        max_new_tokens=12,
        strategy="greedy",
        temperature=0.8,
        top_k=20,
        top_p=0.9,
        min_p=0.01,
        seed=4,
        repetition_penalty=1.1,
    )
    assert data["ids"] == expected.ids and data["stats"]["seed"] == 4
    refused = run(folder, "--prompt", "x", "--temperature", "-1")
    assert refused.exit_code == 1 and "temperature must be 0 (greedy) or a number >= 1e-05" in refused.output


def test_decoding_fields_tune_the_run_and_bad_ones_are_one_line_errors(artifact, generator):
    folder = artifact("llama")
    expected = generator("llama").generate("The quick brown fox", max_new_tokens=12, strategy="greedy")
    result = run(
        folder,
        "--prompt",
        "The quick brown fox",
        "-n",
        "12",
        "--json",
        "--strategy",
        "jacobi",
        "--decoding",
        "jacobi.window=4",
        "--decoding",
        "jacobi.probe_every=4",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ids"] == expected.ids and data["stats"]["window"] == 4 and data["stats"]["adaptive"]
    for bad, message in (
        ("lookahead.branchez=1", "field(s) lookahead.branchez (did you mean lookahead.branches?)"),
        ("lookahead.branches=0", "lookahead.branches must be"),
        ("branches", "FIELD=VALUE"),
    ):
        result = run(folder, "--prompt", "x", "--decoding", bad)
        assert result.exit_code == 1 and result.output.startswith("error: ") and message in result.output, result.output
    listing = run(folder, "--decoding", "help")
    assert listing.exit_code == 0 and "lookahead.decay = 0.9" in listing.output
