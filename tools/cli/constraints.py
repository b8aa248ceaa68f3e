"""`--json-schema FILE`, `--json-object`, `--regex`, `--choice`, `--grammar FILE`: the CLI's way to constrain the
output.

    @click.command()
    @constraint_options
    def generate(..., constraint): ...   # constraint: a runtime.constraints.Constraint, or None

At most one may be given; each is checked (compiled) before the model loads, and a bad one is one
line naming the flag (runtime's InputError).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

FLAGS = ("json_schema", "json_object", "regex", "choice", "grammar")


def constraint_options(command):
    """Add the five flags and hand the command one `constraint` argument instead of them."""
    options = [
        click.option(
            "--json-schema",
            "json_schema",
            type=click.Path(exists=True, dir_okay=False),
            default=None,
            help="Output a JSON value following the JSON schema in this file.",
        ),
        click.option("--json-object", "json_object", is_flag=True, default=False, help="Output a JSON object."),
        click.option(
            "--regex",
            default=None,
            help="Output text the whole of which matches this regular expression (Rust syntax).",
        ),
        click.option("--choice", multiple=True, help="Output exactly one of these strings (repeat the flag for each)."),
        click.option(
            "--grammar",
            type=click.Path(exists=True, dir_okay=False),
            default=None,
            help="Output text in the grammar in this file (Lark, in llguidance's dialect, or GBNF).",
        ),
    ]

    def wrapped(*args, **kwargs):
        given = {name: kwargs.pop(name) for name in FLAGS}
        return command(*args, constraint=constraint_from(**given), **kwargs)

    wrapped.__name__, wrapped.__doc__ = command.__name__, command.__doc__
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


def constraint_from(
    json_schema: str | None = None,
    json_object: bool = False,
    regex: str | None = None,
    choice: tuple[str, ...] = (),
    grammar: str | None = None,
):
    """The Constraint the flags describe (None when none is given); an InputError naming the flag otherwise."""
    from jacobi_rt.runtime.constraints import Constraint
    from jacobi_rt.runtime.errors import InputError

    given = [
        name
        for name, value in (
            ("--json-schema", json_schema),
            ("--json-object", json_object),
            ("--regex", regex),
            ("--choice", choice),
            ("--grammar", grammar),
        )
        if value
    ]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} both constrain the output; pass one of them")
    if json_schema:
        try:
            schema = json.loads(Path(json_schema).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"--json-schema {json_schema}: not a readable JSON file ({exc})") from None
        return Constraint.json_schema(schema, f"--json-schema {json_schema}")
    if json_object:
        return Constraint.json_object("--json-object")
    if regex is not None:
        return Constraint.regex(regex, "--regex")
    if choice:
        return Constraint.choice(list(choice), "--choice")
    if grammar:
        try:
            text = Path(grammar).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--grammar {grammar}: not a readable text file ({exc})") from None
        return Constraint.lark(text, f"--grammar {grammar}")
    return None
