"""`python -m benchmarks.agent_frameworks`: the table and the install hint, without the frameworks."""

from __future__ import annotations

from click.testing import CliRunner

from benchmarks import agent_frameworks
from benchmarks.agent_frameworks import Outcome, table
from benchmarks.agent_modes import Mode


def test_the_table_has_a_column_per_server_and_a_cell_per_mode():
    outcomes = [
        Outcome("jacobi-rt", "langchain-openai", "chat", True, "'hi'", 0.1),
        Outcome("llama-server", "langchain-openai", "chat", False, "a | b", 0.1),
    ]
    lines = table(outcomes, ["jacobi-rt", "llama-server"]).splitlines()
    assert lines[0] == "| framework | mode | jacobi-rt | llama-server |"
    assert lines[2] == "| langchain-openai | chat | works | fails: a \\| b |"


def test_a_missing_framework_is_named_with_its_pip_package(monkeypatch, tmp_path):
    monkeypatch.setattr(agent_frameworks, "MODES", [Mode("langchain-openai", "chat", lambda target: "")])
    monkeypatch.setattr(agent_frameworks.importlib.util, "find_spec", lambda name: None)
    out = CliRunner().invoke(agent_frameworks.main, [str(tmp_path)])
    assert out.exit_code == 1 and 'pip install "langchain-openai"' in out.output
