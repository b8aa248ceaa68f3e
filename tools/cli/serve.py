"""`jacobi-rt serve`: an OpenAI-compatible HTTP server for one artifact (FastAPI + uvicorn, no torch)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from jacobi_rt.runtime.params import STRATEGIES

from .decoding import decoding_config, decoding_option
from .verifying import mapped_option, verify_mode, verify_options


@click.command("serve")
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--draft",
    "-d",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="A draft artifact (`jacobi-rt export MODEL --role draft`) with the same vocabulary, for speculative/auto.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. 127.0.0.1 serves this machine only; 0.0.0.0 serves the network (set --api-key).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="TCP port.")
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    help="A host name clients use to reach the server (repeatable; '*' for any). Without it, only requests "
    "whose Host header is the address they connected to (or localhost on a loopback address) are "
    "served: a web page cannot drive the server through DNS rebinding.",
)
@click.option("--docs", is_flag=True, help="Serve the interactive API docs at /docs and the schema at /openapi.json.")
@click.option(
    "--model-name", default=None, help='The model id clients send as "model". Default: the artifact folder\'s name.'
)
@click.option(
    "--api-key",
    envvar="JACOBI_RT_API_KEY",
    show_envvar=True,
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/* (else 401). /health and /metrics stay open.",
)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGIES),
    default="auto",
    show_default=True,
    help='Decoding strategy when a request names none (its "jacobi": {"strategy": ...} field). '
    "Every strategy gives the same tokens (greedy's, or for a seed the same sample); they differ only "
    "in speed.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=None,
    help="Generations sharing every pass of the model (the batcher's slots; more need the in-place graph). "
    "Default: sized from the artifact and the free memory, at most 16; 1 where the backend's contexts "
    "hold one row. On 2 CPU cores 16 streams served about 5x the tokens/s of one "
    "(docs/bench/2026-12-01-continuous-batching.md).",
)
@click.option(
    "--batch-context",
    type=click.IntRange(2),
    default=None,
    help="Each slot's context, prompt + output. Default: the artifact's, or at most 2048 when its in-place "
    "graph has the default (scatter) attention, which reads a slot's whole context every pass: size it "
    "to what you serve.",
)
@click.option(
    "--no-prefix-cache",
    is_flag=True,
    help="Prefill every prompt whole. By default a finished request's slot keeps its KV (and its n-gram pool "
    "and draft cache) until the slot is needed, and a request whose prompt shares its prefix (the next "
    "turn of a chat) prefills only the rest.",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    hidden=True,
    help="Gone: the server batches every request on one batcher. Use --max-batch.",
)
@click.option(
    "--queue",
    "queue_size",
    type=click.IntRange(0),
    default=32,
    show_default=True,
    help="Requests that may wait for a slot; beyond that the server answers 429 with Retry-After.",
)
@click.option(
    "--timeout",
    "request_timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds a request may take, queueing included; then 504 (a stream gets an error event).",
)
@click.option(
    "--max-body",
    "max_body_bytes",
    type=click.IntRange(1),
    default=1 << 20,
    show_default=True,
    help="Largest request body in bytes; larger ones get 413.",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="On Ctrl-C/SIGTERM, seconds in-flight requests get to finish before they are cancelled.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "cpu", "cuda", "tensorrt"]),
    default="auto",
    show_default=True,
    help="auto: onnxruntime on CUDA when onnxruntime-gpu and a GPU are present, else CPU. "
    "tensorrt: the artifact's engine from `jacobi-rt build`.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="onnxruntime CPU threads of the batcher's passes (one pass runs at a time). Default: the physical cores.",
)
@verify_options
@mapped_option
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
@click.option(
    "--ray",
    "on_ray",
    is_flag=True,
    help="Serve on Ray Serve: --replicas copies of this server behind Ray's HTTP proxy on --host/--port, "
    'each reserving --threads CPUs (default 1). Needs the ray extra: pip install ".[serve,ray]".',
)
@click.option(
    "--replicas",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="With --ray: replicas (the minimum when autoscaling).",
)
@click.option(
    "--max-replicas",
    type=click.IntRange(1),
    default=None,
    help="With --ray: autoscale between --replicas and this many replicas.",
)
@click.option(
    "--address",
    default=None,
    help="With --ray: a running Ray cluster to deploy on ('auto': the one `ray start` made on this node). "
    "Default: a local Ray instance. Every node needs the artifact at the same path.",
)
@decoding_option
def serve_command(
    artifact,
    draft,
    host,
    port,
    allowed_hosts,
    docs,
    model_name,
    api_key,
    strategy,
    max_batch,
    batch_context,
    no_prefix_cache,
    workers,
    queue_size,
    request_timeout,
    max_body_bytes,
    shutdown_grace,
    backend,
    threads,
    verify,
    no_verify,
    mapped,
    log_level,
    on_ray,
    replicas,
    max_replicas,
    address,
    decoding,
):
    """Serve the artifact folder ARTIFACT over an OpenAI-compatible HTTP API.

    \b
    Endpoints:
      POST /v1/completions        prompt -> text ("stream": true for server-sent events)
      POST /v1/chat/completions   messages -> reply (the artifact's chat template applied)
      GET  /v1/models             the served model (its id: --model-name)
      GET  /health, GET /metrics  liveness; Prometheus metrics
    Sampling as OpenAI defines it (temperature, top_p, seed, n, penalties, logprobs; vLLM's top_k,
    min_p, repetition_penalty); temperature 0 or left out is greedy. jacobi-rt's own knobs go in
    a "jacobi" field ({"strategy": "jacobi", "window": 8}, and any per-request --decoding field,
    e.g. {"branches": 1}); --decoding sets the server's defaults. Responses carry the decoding stats
    (tokens per pass, passes) in a "jacobi" field too.

    \b
    Examples:
      jacobi-rt serve build/smollm2-135m --port 8000
      jacobi-rt serve build/smollm2-135m --ray --replicas 2 --threads 1   # Ray Serve (README, Serve)
      curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
    \b
      from openai import OpenAI
      client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
      client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}])

    Needs the serve extra: pip install ".[serve]" from the jacobi-rt checkout.
    """
    from jacobi_rt.runtime.errors import require

    hint = 'pip install ".[serve]" from the jacobi-rt checkout'
    require("fastapi", hint)
    require("uvicorn", hint)
    from jacobi_rt.runtime import Generator
    from jacobi_rt.server.run import serve
    from jacobi_rt.server.settings import ServerSettings

    config = decoding_config(decoding)
    if workers is not None:  # removed in 0.x: one release of a clear message
        click.echo(
            f"--workers is gone: the server batches every request on one batcher of slots (--max-batch, default "
            f"sized from the artifact and memory); running with --max-batch {max_batch or workers}",
            err=True,
        )
        max_batch = max_batch or max(1, workers)
    settings = ServerSettings(
        model_id=model_name or Path(artifact).resolve().name,
        queue_size=queue_size,
        request_timeout=request_timeout,
        max_body_bytes=max_body_bytes,
        api_key=api_key or None,
        default_strategy=strategy,
        shutdown_grace=shutdown_grace,
        allowed_hosts=tuple(allowed_hosts),
        docs=docs,
        max_batch=max_batch,
        batch_context=batch_context,
    )
    if on_ray:
        return _serve_on_ray(
            artifact,
            draft,
            settings,
            backend,
            threads or 1,
            verify_mode(verify, no_verify),
            replicas,
            max_replicas,
            address,
            host,
            port,
            config,
            not no_prefix_cache,
            mapped,
        )
    generator = Generator.load(
        artifact,
        draft=draft,
        backend=backend,
        threads=threads,
        verify=verify_mode(verify, no_verify),
        config=config,
        prefix_cache=not no_prefix_cache,
        mapped=mapped,
    )
    slots = max_batch or generator.default_slots()
    settings.max_batch = slots
    sized = "" if max_batch else ", sized from the artifact and memory; --max-batch changes it"
    click.echo(
        f"serving {artifact} as model {settings.model_id!r} on http://{host}:{port}/v1 ({slots} slots{sized}, "
        f"{getattr(generator.backend, 'threads', 'default')} threads, queue {queue_size}"
        f"{', API key required' if api_key else ''})",
        err=True,
    )
    click.echo(generator.backend.rows.line(), err=True)
    if mapped:
        where = generator.backend.session_graph.parent if getattr(generator.backend, "mapped", False) else None
        click.echo(
            f"mapped session: {where or 'none (JACOBI_RT_CACHE is off, or not on the CPU); the artifact graph'}",
            err=True,
        )
    serve(generator, settings, host=host, port=port, log_level=log_level)


def _serve_on_ray(
    artifact,
    draft,
    settings,
    backend,
    threads,
    verify,
    replicas,
    max_replicas,
    address,
    host,
    port,
    config=None,
    prefix_cache=True,
    mapped=False,
):
    """Deploy on Ray Serve (server/ray_app.py) and wait for Ctrl-C; then remove the application."""
    from jacobi_rt.runtime.errors import require

    require("ray", 'pip install ".[serve,ray]" from the jacobi-rt checkout')
    from ray import serve

    from jacobi_rt.server.ray_app import APP_NAME, PinnedArtifact, RayPlan, ReplicaSpec, run

    spec = ReplicaSpec(
        PinnedArtifact.of(artifact),
        settings,
        threads=threads,
        draft=PinnedArtifact.of(draft) if draft else None,
        backend=backend,
        verify=verify,
        config=config,
        prefix_cache=prefix_cache,
        mapped=mapped,
    )
    plan = RayPlan(replicas, max_replicas)
    run(spec, plan, host=host, port=port, address=address)
    for stop in (
        signal.SIGINT,
        signal.SIGTERM,
    ):  # both as Ctrl-C (after ray.init, which sets its own), even where SIGINT came ignored
        signal.signal(stop, _interrupt)
    scaling = f"{replicas}-{max_replicas} replicas (autoscaled)" if max_replicas else f"{replicas} replicas"
    click.echo(
        f"serving {artifact} as model {settings.model_id!r} on Ray Serve at http://{host}:{port}/v1 "
        f"({scaling} x {threads} CPUs/threads); Ctrl-C stops it",
        err=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("removing the application", err=True)
        serve.delete(APP_NAME)
        if address is None:
            serve.shutdown()


def _interrupt(signum, frame):
    raise KeyboardInterrupt
