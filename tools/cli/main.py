"""The `jacobi-rt` command: a small root group; each subcommand lives in its own module.

Heavy imports (torch, onnxruntime, transformers) happen inside the commands, so `--help` is fast.
Known errors print one line that says what to do, exit code 1; set JACOBI_RT_DEBUG=1 for the traceback.
Every option can also come from the environment: JACOBI_RT_<COMMAND>_<OPTION> (click's auto_envvar_prefix).
"""

from __future__ import annotations

import os
import sys

import click

from jacobi_rt import __version__
from jacobi_rt.runtime.errors import JacobiError


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except JacobiError as exc:
            if os.environ.get("JACOBI_RT_DEBUG"):
                raise
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(1)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "JACOBI_RT"})
@click.version_option(__version__, prog_name="jacobi-rt")
def cli():
    """jacobi-rt: Jacobi, lookahead and speculative decoding, token-identical to one token a pass.

    \b
    Typical use:
      jacobi-rt export smollm2-135m --out build/smollm2-135m
      jacobi-rt generate build/smollm2-135m --prompt "Write a haiku" --strategy jacobi

    Every option can also be set in the environment as JACOBI_RT_<COMMAND>_<OPTION>,
    e.g. JACOBI_RT_SERVE_PORT=8080 or JACOBI_RT_GENERATE_BACKEND=cpu; a flag given on the
    command line wins.
    """


def _add_commands() -> None:
    from . import bench, build, export, generate, random_model, serve, verify

    cli.add_command(export.export_command)
    cli.add_command(build.build_command)
    cli.add_command(generate.generate_command)
    cli.add_command(serve.serve_command)
    cli.add_command(bench.bench_command)
    cli.add_command(random_model.random_model_command)
    cli.add_command(verify.verify_command)


_add_commands()
