"""How a command loads an artifact (generate, serve): `--verify MODE` / `--no-verify` (its files' check) and
`--mapped` (the mapped session)."""

from __future__ import annotations

import click

from jacobi_rt.runtime.file_digest import MODES


def verify_options(command):
    """Add --verify and --no-verify to `command` (its parameters `verify`, `no_verify`; `verify_mode` reads them)."""
    command = click.option("--no-verify", is_flag=True, help="The same as --verify none.")(command)
    return click.option(
        "--verify",
        "verify",
        type=click.Choice(MODES),
        default="sampled",
        show_default=True,
        help="How the artifact's files are checked before loading: sampled = size and a digest of 64 blocks of "
        "each (a few MB read); full = every byte's sha256 (as `jacobi-rt verify`); none = no check.",
    )(command)


def verify_mode(verify: str, no_verify: bool) -> str:
    return "none" if no_verify else verify


def mapped_option(command):
    """Add --mapped to `command` (its parameter `mapped`: Generator.load's)."""
    return click.option(
        "--mapped",
        is_flag=True,
        help="CPU: map the graph optimized and prepacked for this CPU (made at the first such load under "
        "$JACOBI_RT_CACHE/sessions, about the weights' size on disk): faster loads, and processes on one host "
        "(server replicas) share the weights' pages; decode measured 0.93x at 8B.",
    )(command)
