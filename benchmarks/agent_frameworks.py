"""Agent frameworks against jacobi-rt's server and llama-server, mode by mode, over real HTTP (issue 37).

    python -m benchmarks.agent_frameworks ARTIFACT [--gguf FILE.gguf] [--only PATTERN] [--out FILE.json]
        [--record DIR] [--llama-arg=--chat_format=chatml-function-calling]

Starts `jacobi-rt serve ARTIFACT` (its defaults) and, with --gguf, llama-cpp-python's OpenAI server
(`python -m llama_cpp.server --model FILE.gguf`, its defaults unless --llama-arg), each as a subprocess on a
free loopback port; runs every mode of benchmarks/agent_modes.py (LangChain, pydantic-ai, the openai-agents SDK)
on each, and prints a markdown table: per framework and mode, "works" or "fails: why". The frameworks are
not dependencies of jacobi-rt: a missing one is named with its pip package. --record writes the request
bodies each mode sent, per server, as JSON (the fixtures of tests/server/test_agent_frameworks.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from .agent_modes import MODES, Mode, ModeFailed, Target

IMPORTS = {"langchain-openai": "langchain_openai", "pydantic-ai-slim[openai]": "pydantic_ai", "openai-agents": "agents"}


@dataclass(frozen=True)
class Outcome:
    server: str
    framework: str
    mode: str
    works: bool
    detail: str
    seconds: float


def missing_package(mode: Mode) -> str | None:
    return None if importlib.util.find_spec(IMPORTS[mode.framework]) else f'pip install "{mode.framework}"'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def started(command: list[str], port: int, log: Path, wait_s: float = 300):
    """A server subprocess, yielded once GET /v1/models answers; its model id and base URL."""
    import httpx

    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            deadline = time.monotonic() + wait_s
            while True:
                if process.poll() is not None:
                    raise click.ClickException(f"{command[2]} exited with {process.returncode}; see {log}")
                try:
                    models = httpx.get(base + "/models", timeout=5).json()["data"]
                    break
                except (httpx.HTTPError, KeyError, ValueError):
                    if time.monotonic() > deadline:
                        raise click.ClickException(
                            f"{command[2]} did not answer in {wait_s:.0f} s; see {log}"
                        ) from None
                    time.sleep(1)
            yield base, models[0]["id"]
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def server_commands(artifact: str, gguf: str | None, llama_args: tuple[str, ...]) -> dict[str, list[str]]:
    port = free_port()
    commands = {"jacobi-rt": [sys.executable, "-m", "jacobi_rt", "serve", artifact, "--port", str(port)]}
    if gguf:
        commands["llama-server"] = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--port",
            str(free_port()),
            *llama_args,
        ]
    return commands


def run_mode(server: str, mode: Mode, target: Target) -> Outcome:
    start = time.perf_counter()
    try:
        detail, works = mode.run(target), True
    except ModeFailed as exc:
        detail, works = str(exc), False
    except Exception as exc:  # noqa: BLE001 - the framework's own error is the finding
        detail, works = f"{type(exc).__name__}: {_short(str(exc))}", False
    return Outcome(server, mode.framework, mode.name, works, detail, round(time.perf_counter() - start, 1))


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def table(outcomes: list[Outcome], servers: list[str]) -> str:
    """framework | mode | one column per server: works, or fails: why."""
    cells = {(o.framework, o.mode, o.server): ("works" if o.works else f"fails: {o.detail}") for o in outcomes}
    rows = dict.fromkeys((o.framework, o.mode) for o in outcomes)
    lines = ["| framework | mode | " + " | ".join(servers) + " |", "|---|---|" + "---|" * len(servers)]
    for framework, mode in rows:
        row = [cells.get((framework, mode, server), "-").replace("|", "\\|") for server in servers]
        lines.append(f"| {framework} | {mode} | " + " | ".join(row) + " |")
    return "\n".join(lines)


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--gguf",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Also run llama-cpp-python's server on this GGUF (pip install 'llama-cpp-python[server]').",
)
@click.option("--llama-arg", "llama_args", multiple=True, help="An argument for llama_cpp.server (repeatable).")
@click.option(
    "--servers",
    default="jacobi-rt,llama-server",
    show_default=True,
    help="Which servers to run (comma-separated; llama-server needs --gguf).",
)
@click.option("--only", default="", help="Run the modes whose 'framework mode' contains this text.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write every outcome as JSON here.")
@click.option("--record", type=click.Path(file_okay=False), default=None, help="Write each mode's request bodies here.")
@click.option(
    "--logs",
    type=click.Path(file_okay=False),
    default="build/agent-frameworks",
    show_default=True,
    help="The servers' logs.",
)
def main(artifact, gguf, llama_args, servers, only, out, record, logs):
    """Run each agent framework's modes against jacobi-rt serve (and llama-server) and print the table."""
    modes = [m for m in MODES if only in f"{m.framework} {m.name}"]
    missing = sorted({hint for m in modes if (hint := missing_package(m))})
    if missing:
        raise click.ClickException("the frameworks are not installed: " + "; ".join(missing))
    Path(logs).mkdir(parents=True, exist_ok=True)
    outcomes, sent = [], {}
    commands = {
        name: c for name, c in server_commands(artifact, gguf, llama_args).items() if name in servers.split(",")
    }
    for server, command in commands.items():
        with started(command, int(command[command.index("--port") + 1]), Path(logs) / f"{server}.log") as (base, model):
            for mode in modes:
                target = Target(base, model)
                outcome = run_mode(server, mode, target)
                click.echo(
                    f"{server:12s} {mode.framework:24s} {mode.name:34s} "
                    f"{'works' if outcome.works else 'FAILS'} ({outcome.seconds} s) {outcome.detail}",
                    err=True,
                )
                outcomes.append(outcome)
                sent[(server, mode.framework, mode.name)] = target.sent
    click.echo(table(outcomes, list(commands)))
    ran = "python -m benchmarks.agent_frameworks " + " ".join(sys.argv[1:])
    click.echo(f"\ncommand: {ran}\nservers: " + "; ".join(" ".join(c[1:]) for c in commands.values()))
    if out:
        Path(out).write_text(json.dumps({"commands": commands, "outcomes": [asdict(o) for o in outcomes]}, indent=1))
    if record:
        _record(Path(record), sent)


def _record(folder: Path, sent: dict) -> None:
    from importlib.metadata import version

    folder.mkdir(parents=True, exist_ok=True)
    versions = {package: version(package.split("[")[0]) for package in (*IMPORTS, "openai")}
    for server in {key[0] for key in sent}:
        bodies = [{"framework": f, "mode": m, "requests": r} for (s, f, m), r in sent.items() if s == server]
        (folder / f"{server}.json").write_text(json.dumps({"recorded_with": versions, "modes": bodies}, indent=1))


if __name__ == "__main__":
    main()
