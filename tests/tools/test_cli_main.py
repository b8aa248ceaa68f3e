"""The `jacobi-rt` root command: options from the environment, `python -m jacobi_rt`, one strategy list, no
clashing short flags."""

from __future__ import annotations

import json
import subprocess
import sys

import click
from click.testing import CliRunner

from jacobi_rt import __version__
from jacobi_rt.runtime.params import STRATEGIES
from jacobi_rt.tools.cli.main import cli


def option(command: str, name: str) -> click.Option:
    return next(p for p in cli.commands[command].params if p.name == name)


def test_p_means_prompt_in_generate_and_nothing_in_serve():
    assert "-p" in option("generate", "prompt").opts
    assert option("serve", "port").opts == ["--port"]  # `-p 8000` was --port in serve, --prompt in generate
    result = CliRunner().invoke(cli, ["serve", ".", "-p", "8000"])
    assert result.exit_code == 2 and "No such option '-p'" in result.output


def test_every_command_offers_the_runtime_strategy_list():
    for command in ("generate", "serve"):
        assert list(option(command, "strategy").type.choices) == list(STRATEGIES)


def test_generate_and_serve_check_an_artifact_the_same_ways():
    for command in ("generate", "serve"):
        assert list(option(command, "verify").type.choices) == ["sampled", "full", "none"]
        assert option(command, "verify").default == "sampled" and option(command, "no_verify").is_flag


def test_options_come_from_jacobi_rt_environment_variables(artifact):
    folder = str(artifact("llama"))
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["generate", folder, "--prompt", "The quick", "--json"],
        env={"JACOBI_RT_GENERATE_MAX_NEW_TOKENS": "3", "JACOBI_RT_GENERATE_STRATEGY": "jacobi"},
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["new_tokens"] == 3 and stats["strategy"] == "jacobi"
    flag_wins = runner.invoke(
        cli,
        ["generate", folder, "--prompt", "The quick", "--json", "-n", "2"],
        env={"JACOBI_RT_GENERATE_MAX_NEW_TOKENS": "3"},
    )
    assert json.loads(flag_wins.stdout)["stats"]["new_tokens"] == 2
    bad_port = runner.invoke(cli, ["serve", folder], env={"JACOBI_RT_SERVE_PORT": "not-a-port"})
    assert bad_port.exit_code == 2 and "--port" in bad_port.output  # read (and checked) before anything loads


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "jacobi_rt", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and __version__ in done.stdout and "jacobi-rt" in done.stdout
