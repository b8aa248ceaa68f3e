"""Load-test `jacobi-rt serve` on loopback: requests/s and latency at several client counts, and
tokens/s per stream for each decoding strategy.

    python -m benchmarks.load_bench build/smollm2-135m --clients 1,4,16 --strategies greedy,jacobi,lookahead
    python -m benchmarks.load_bench --url http://127.0.0.1:8000 --clients 4   # a server already running

The server batches by default (its slots sized from the artifact and memory; --max-batch sets
them). Side by side in one run: that server, one of a single slot, one request at a time
(--baseline, what `serve` did before it batched), and onnxruntime-genai generating the same prompts
as one static batch offline (--ortgenai FOLDER), with prompts of exactly N tokens (--prompt-tokens):

    python -m benchmarks.load_bench build/smollm2-135m --baseline --clients 1,16 \
        --requests 2 --strategy greedy --strategies greedy --prompt-tokens 128 --max-tokens 64 \
        --ortgenai build/ortgenai-fp32 --out build/load_batch.json

Without --url it starts `jacobi-rt serve ARTIFACT` itself as a separate process (so the clients do
not share its GIL) on a free loopback port, and stops it at the end. Every request is a streamed
chat or completion (from the bundled prompts) with `stream_options.include_usage`, so each one gives
its latency, time to first token, tokens and tokens per pass. Each level is bounded by a request
count and a time limit; requests in flight at the limit still finish. Prints a table, writes JSON.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

PROMPTS = Path(__file__).resolve().parents[1] / "tools" / "data" / "prompts.jsonl"  # the bench set


@dataclass
class Sample:
    """One request as the client saw it."""

    status: int
    latency: float  # request sent -> [DONE]
    first_token: float = 0.0  # request sent -> first text piece
    tokens: int = 0  # completion tokens (the server's usage)
    decode_seconds: float = 0.0  # first piece -> last piece
    tokens_per_pass: float = 0.0  # the server's jacobi stats
    server_tokens_per_second: float = 0.0  # the runtime's own decode rate (no HTTP), from the same stats
    error: str = ""


@dataclass
class Level:
    """A batch of requests under one setting (client count, strategy) and what it measured."""

    name: str
    clients: int
    strategy: str
    max_tokens: int
    wall_seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict:
        ok = [s for s in self.samples if s.status == 200 and not s.error]
        latencies = sorted(s.latency for s in ok)
        streams = [(s.tokens - 1) / s.decode_seconds for s in ok if s.decode_seconds > 0 and s.tokens > 1]
        return {
            "name": self.name,
            "clients": self.clients,
            "strategy": self.strategy,
            "max_tokens": self.max_tokens,
            "requests": len(self.samples),
            "ok": len(ok),
            "errors": len(self.samples) - len(ok),
            "wall_seconds": round(self.wall_seconds, 2),
            "requests_per_second": round(len(ok) / self.wall_seconds, 3) if self.wall_seconds else 0.0,
            "latency_p50": _round(_percentile(latencies, 50)),
            "latency_p99": _round(_percentile(latencies, 99)),
            "first_token_p50": _round(_percentile(sorted(s.first_token for s in ok), 50)),
            "first_token_p99": _round(_percentile(sorted(s.first_token for s in ok), 99)),
            "tokens_per_second": round(sum(s.tokens for s in ok) / self.wall_seconds, 2) if self.wall_seconds else 0.0,
            "stream_tokens_per_second": round(statistics.median(streams), 2) if streams else 0.0,
            "server_tokens_per_second": round(statistics.median(s.server_tokens_per_second for s in ok), 2)
            if ok
            else 0.0,
            "tokens_per_pass": round(statistics.mean(s.tokens_per_pass for s in ok), 3) if ok else 0.0,
        }


# -- one request ------------------------------------------------------------------------------


def request_once(
    conn: http.client.HTTPConnection, prompt: dict, max_tokens: int, strategy: str, api_key: str | None
) -> Sample:
    """Send one streamed request on `conn` and read it to [DONE]."""
    body = {
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "jacobi": {"strategy": strategy},
    }
    if "ids" in prompt:
        path, body["prompt"] = "/v1/completions", prompt["ids"]
    elif prompt.get("chat"):
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt["prompt"]}]
    else:
        path, body["prompt"] = "/v1/completions", prompt["prompt"]
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    sent = time.perf_counter()
    conn.request("POST", path, json.dumps(body), headers)
    response = conn.getresponse()
    if response.status != 200:
        text = response.read().decode(errors="replace")
        return Sample(response.status, time.perf_counter() - sent, error=text[:200])
    sample, first, last = Sample(200, 0.0), None, None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            sample.error = event["error"]["message"][:200]
        elif event.get("usage"):
            sample.tokens = event["usage"]["completion_tokens"]
        elif event["choices"] and _piece(event["choices"][0]):
            last = time.perf_counter()
            first = first or last
        if "jacobi" in event:
            sample.tokens_per_pass = event["jacobi"]["tokens_per_pass"]
            sample.server_tokens_per_second = event["jacobi"]["decode_tokens_per_second"]
    response.read()  # the connection is reused for the next request
    sample.latency = time.perf_counter() - sent
    sample.first_token = (first or sent) - sent
    sample.decode_seconds = (last - first) if first else 0.0
    return sample


def _piece(choice: dict) -> str:
    return (choice["delta"].get("content") or "") if "delta" in choice else (choice.get("text") or "")


# -- one level --------------------------------------------------------------------------------


def run_level(
    url: str, level: Level, prompts: list[dict], requests: int, seconds: float, api_key: str | None, bar
) -> Level:
    """`level.clients` threads send requests back to back until `requests` were sent or `seconds` passed."""
    host, port = _host_port(url)
    lock, sent = threading.Lock(), [0]
    deadline = time.perf_counter() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=600)
        try:
            while time.perf_counter() < deadline:
                with lock:
                    if sent[0] >= requests:
                        return
                    index, sent[0] = sent[0], sent[0] + 1
                try:
                    sample = request_once(
                        conn, prompts[index % len(prompts)], level.max_tokens, level.strategy, api_key
                    )
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    sample = Sample(0, 0.0, error=f"{type(exc).__name__}: {exc}")
                    conn.close()
                with lock:
                    level.samples.append(sample)
                bar.update(1)
        finally:
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(level.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level.wall_seconds = time.perf_counter() - started
    return level


# -- the server -------------------------------------------------------------------------------


@contextmanager
def local_server(
    artifact: str,
    queue: int,
    threads: int | None,
    api_key: str | None,
    max_batch: int | None = None,
    ray_replicas: int | None = None,
    batch_context: int | None = None,
    extra: list[str] = (),
) -> Iterator[str]:
    """`jacobi-rt serve ARTIFACT` in a child process on a free loopback port; yields its URL.
    ray_replicas: `--ray --replicas N` (a local Ray instance, stopped with the server); extra: more options."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-c",
        "from jacobi_rt.tools.cli.main import cli; cli()",
        "serve",
        artifact,
        "--port",
        str(port),
        "--queue",
        str(queue),
        "--log-level",
        "warning",
    ]
    if threads:
        command += ["--threads", str(threads)]
    if max_batch:
        command += ["--max-batch", str(max_batch)] + (["--batch-context", str(batch_context)] if batch_context else [])
    if ray_replicas:
        command += ["--ray", "--replicas", str(ray_replicas)]
    command += list(extra)
    env = {**os.environ, **({"JACOBI_RT_API_KEY": api_key} if api_key else {})}
    process = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, 180)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_healthy(url: str, process: subprocess.Popen, seconds: float) -> None:
    host, port = _host_port(url)
    limit = time.monotonic() + seconds
    while time.monotonic() < limit:
        if process.poll() is not None:
            raise click.ClickException(f"the server exited with code {process.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise click.ClickException(f"the server at {url} was not ready within {seconds:g} s")


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


# -- report -----------------------------------------------------------------------------------

COLUMNS = [
    ("name", "level", 18),
    ("clients", "clients", 7),
    ("strategy", "strategy", 9),
    ("ok", "ok", 4),
    ("errors", "err", 4),
    ("requests_per_second", "req/s", 7),
    ("latency_p50", "p50 s", 7),
    ("latency_p99", "p99 s", 7),
    ("first_token_p50", "ttft s", 7),
    ("first_token_p99", "ttft p99", 8),
    ("tokens_per_second", "tok/s", 7),
    ("stream_tokens_per_second", "tok/s/stream", 12),
    ("server_tokens_per_second", "runtime tok/s", 13),
    ("tokens_per_pass", "tok/pass", 8),
]


def table(summaries: list[dict]) -> str:
    head = " ".join(f"{title:>{width}}" for _, title, width in COLUMNS)
    rows = [" ".join(f"{row.get(key, '')!s:>{width}}" for key, _, width in COLUMNS) for row in summaries]
    return "\n".join([head, "-" * len(head), *rows])


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    rank = (len(values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def _round(x: float) -> float:
    return round(x, 3)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


@click.command()
@click.argument("artifact", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--url", default=None, help="Load a server already running at this URL instead of starting one.")
@click.option("--clients", default="1,4,16", show_default=True, help="Comma-separated concurrent client counts.")
@click.option(
    "--requests",
    "per_client",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Requests per client at each client count (so 16 clients send 48).",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="Time limit per level; requests in flight at the limit still finish.",
)
@click.option(
    "--max-tokens", type=click.IntRange(1), default=32, show_default=True, help="max_tokens of the load requests."
)
@click.option("--strategy", default="auto", show_default=True, help="Strategy of the load requests.")
@click.option(
    "--strategies",
    default="greedy,jacobi,lookahead",
    show_default=True,
    help="Per-stream comparison: strategies run one client at a time ('' to skip).",
)
@click.option(
    "--stream-requests",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Requests per strategy in the comparison.",
)
@click.option(
    "--stream-max-tokens", type=click.IntRange(1), default=64, show_default=True, help="max_tokens in the comparison."
)
@click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=None,
    help="The started server's --max-batch (default: its own sizing).",
)
@click.option("--batch-context", type=click.IntRange(2), default=None, help="The started server's --batch-context.")
@click.option(
    "--baseline",
    is_flag=True,
    help="Also run every level on a server of one slot (--max-batch 1: one request at a time), side by side.",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Send token-id prompts of exactly N tokens (the bundled prompts' text run together; needs ARTIFACT "
    "for its tokenizer); 0: the bundled prompts as they are.",
)
@click.option(
    "--ortgenai",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="An onnxruntime-genai model folder: also generate the widest level's prompts as one static batch "
    "offline (its best case), greedy, --max-tokens each.",
)
@click.option(
    "--ray",
    "ray_replicas",
    type=click.IntRange(1),
    default=None,
    help="Start the server on Ray Serve with this many replicas (`--ray --replicas N`, each --threads CPUs).",
)
@click.option(
    "--prefix-cache/--no-prefix-cache",
    default=False,
    show_default=True,
    help="The started server's prefix cache. Off by default: the bench sends the bundled prompts again and "
    "again, and a cached prompt would skip its prefill (benchmarks/chat_bench.py measures the cache).",
)
@click.option("--queue", type=click.IntRange(0), default=64, show_default=True, help="The started server's --queue.")
@click.option(
    "--threads", type=click.IntRange(1), default=None, help="The started server's --threads (default: its own)."
)
@click.option(
    "--api-key",
    envvar="JACOBI_RT_API_KEY",
    default=None,
    help="Sent as a bearer token (and required by a started server).",
)
@click.option(
    "--out", type=click.Path(dir_okay=False), default="build/load_bench.json", show_default=True, help="JSON results."
)
def main(
    artifact,
    url,
    clients,
    per_client,
    seconds,
    max_tokens,
    strategy,
    strategies,
    stream_requests,
    stream_max_tokens,
    max_batch,
    batch_context,
    baseline,
    prompt_tokens,
    ortgenai,
    ray_replicas,
    prefix_cache,
    queue,
    threads,
    api_key,
    out,
):
    """Load-test an OpenAI-compatible jacobi-rt server on loopback (ARTIFACT: start one; or --url)."""
    from tqdm import tqdm

    if (artifact is None) == (url is None):
        raise click.UsageError("pass an ARTIFACT folder (a server is started for it) or --url of a running server")
    prompts = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    if prompt_tokens:
        if artifact is None:
            raise click.UsageError("--prompt-tokens needs the ARTIFACT (its tokenizer makes the prompts)")
        prompts = token_prompts(artifact, prompts, prompt_tokens)
    counts = [int(c) for c in _names(clients)]
    compare = _names(strategies)
    servers = [("batch" if baseline else "", max_batch)] + ([("one-slot", 1)] if baseline else [])
    levels, summaries = [], []
    for label, batch in servers:
        tag = f"{label} " if label else ""
        mine = [Level(f"{tag}load x{c}", c, strategy, max_tokens) for c in counts]
        mine += [Level(f"{tag}stream {s}", 1, s, stream_max_tokens) for s in compare]
        budgets = [c * per_client for c in counts] + [stream_requests] * len(compare)
        extra = [] if prefix_cache else ["--no-prefix-cache"]
        server = (
            local_server(artifact, queue, threads, api_key, batch, ray_replicas, batch_context, extra)
            if url is None
            else _existing(url)
        )
        with server as base:
            warm = Level("warm-up", 1, strategy, 4)
            run_level(base, warm, prompts, 1, seconds, api_key, _NoBar())
            with tqdm(total=sum(budgets), desc=label or "load", unit="req", file=sys.stderr) as bar:
                for level, budget in zip(mine, budgets):
                    bar.set_postfix_str(level.name)
                    run_level(base, level, prompts, budget, seconds, api_key, bar)
        levels += mine
    summaries = [level.summary() for level in levels]
    if ortgenai:
        summaries.append(ortgenai_static_batch(ortgenai, prompts[: max(counts)], max_tokens, threads))
    click.echo(table(summaries))
    report = {
        "artifact": artifact,
        "url": url,
        "queue": queue if url is None else None,
        "max_batch": max_batch,
        "ray_replicas": ray_replicas,
        "threads": threads,
        "prompt_tokens": prompt_tokens,
        "cpu_count": os.cpu_count(),
        "summaries": summaries,
        "samples": {level.name: [asdict(s) for s in level.samples] for level in levels},
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2))
    click.echo(f"wrote {out}", err=True)


def token_prompts(artifact: str, prompts: list[dict], length: int) -> list[dict]:
    """Prompts of exactly `length` token ids: prompt i is the bundled texts from the i-th on, run together."""
    from jacobi_rt.runtime.manifest import load_manifest
    from jacobi_rt.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(artifact, load_manifest(artifact, verify=False))
    texts = [p["prompt"] for p in prompts]
    out = []
    for i in range(len(texts)):
        ids: list[int] = []
        for text in texts[i:] + texts[:i]:
            ids += tokenizer.encode(text + "\n", add_special_tokens=False)
            if len(ids) >= length:
                break
        out.append({"id": f"tokens-{i}", "ids": ids[:length]})
    return out


def ortgenai_static_batch(folder: str, prompts: list[dict], max_tokens: int, threads: int | None) -> dict:
    """onnxruntime-genai generating `prompts` (token ids, all one length) as one batch, greedy: its best case."""
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(folder)
    if threads:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)
    ids = np.array([p["ids"] for p in prompts], dtype=np.int32)
    started = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=len(prompts), max_length=ids.shape[1] + max_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    first = None
    while not generator.is_done():
        generator.generate_next_token()
        first = first or time.perf_counter() - started
    wall = time.perf_counter() - started
    eos = set(_eos_ids(folder))
    tokens = 0
    for row in range(len(prompts)):
        new = [int(t) for t in generator.get_sequence(row)][ids.shape[1] :]
        tokens += next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
    return {
        "name": f"ortgenai static x{len(prompts)}",
        "clients": len(prompts),
        "strategy": "greedy",
        "max_tokens": max_tokens,
        "requests": len(prompts),
        "ok": len(prompts),
        "errors": 0,
        "wall_seconds": round(wall, 2),
        "first_token_p50": _round(first or wall),
        "first_token_p99": _round(first or wall),
        "tokens_per_second": round(tokens / wall, 2),
    }


def _eos_ids(folder: str) -> list[int]:
    eos = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


@contextmanager
def _existing(url: str) -> Iterator[str]:
    yield url.rstrip("/")


class _NoBar:
    def update(self, n: int) -> None:
        pass


if __name__ == "__main__":
    main()
