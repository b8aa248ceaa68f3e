"""tools/cli/constraints.py: the CLI's constraint flags become one checked Constraint (or None)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from jacobi_rt.runtime.errors import InputError  # noqa: E402
from jacobi_rt.tools.cli.constraints import constraint_options  # noqa: E402


@click.command()
@constraint_options
def show(constraint):
    click.echo("none" if constraint is None else f"{constraint.kind} {constraint.where}")


def run(*args):
    return CliRunner().invoke(show, list(args))


def test_each_flag(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "yes" | "no"\n')
    assert run().output == "none\n"
    assert run("--json-schema", str(schema)).output == f"json_schema --json-schema {schema}\n"
    assert run("--json-object").output == "json_object --json-object\n"
    assert run("--regex", "[0-9]+").output == "regex --regex\n"
    assert run("--choice", "yes", "--choice", "no").output == "choice --choice\n"
    assert run("--grammar", str(grammar)).output == f"grammar --grammar {grammar}\n"


def test_mistakes_name_the_flag(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "foo"}')
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for args, says in [
        (("--regex", "("), "--regex: invalid or unsupported regular expression"),
        (("--json-schema", str(bad)), f"--json-schema {bad}: invalid or unsupported schema"),
        (("--json-schema", str(broken)), "not a readable JSON file"),
        (("--regex", "a", "--choice", "b"), "--regex and --choice both constrain"),
    ]:
        result = run(*args)
        assert isinstance(result.exception, InputError) and says in str(result.exception), (args, result.exception)
