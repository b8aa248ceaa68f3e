"""`--decoding FIELD=VALUE`: the CLI's way to set runtime.config.DecodingConfig fields (generate, serve, bench)."""

from __future__ import annotations

import json

import click


def _show_fields(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    if "help" in values:
        from jacobi_rt.runtime.config import describe

        for name, default, why in describe():
            click.echo(f"{name} = {default!r}\n    {why}")
        ctx.exit()
    return values


decoding_option = click.option(
    "--decoding",
    "decoding",
    multiple=True,
    metavar="FIELD=VALUE",
    callback=_show_fields,
    help="Set a decoding tuning constant (runtime.config.DecodingConfig; repeatable; VALUE is JSON): e.g. "
    "--decoding lookahead.branches=1 --decoding draft.max_length=4. None of them changes the output. "
    "`--decoding help` lists every field with its default and why.",
)


def decoding_config(values: tuple[str, ...]):
    """The DecodingConfig the --decoding values describe (checked: a clear InputError otherwise)."""
    from jacobi_rt.runtime.config import DEFAULTS

    return DEFAULTS.with_overrides(parse_assignments(list(values)))


def parse_assignments(items: list[str] | tuple[str, ...]) -> dict:
    """`FIELD=VALUE` strings (the CLI's --decoding; FIELD dotted, e.g. lookahead.branches) as overrides;
    VALUE is JSON (8, 0.5, true, null, [[1, 1.0], [8, 1.4]]), else text."""
    from jacobi_rt.runtime.config import FIELDS
    from jacobi_rt.runtime.errors import InputError

    out: dict = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise InputError(
                f"--decoding takes FIELD=VALUE (e.g. lookahead.branches=1), not {item!r}; the fields "
                f"are {', '.join(FIELDS)}"
            )
        try:
            out[name.strip()] = json.loads(text)
        except ValueError:
            out[name.strip()] = text
    return out
