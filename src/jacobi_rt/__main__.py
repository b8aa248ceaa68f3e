"""`python -m jacobi_rt`: the `jacobi-rt` command, for environments without the console script on PATH."""

from jacobi_rt.tools.cli.main import cli

cli(prog_name="jacobi-rt")
