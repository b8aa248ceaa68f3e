"""Ray Serve: `jacobi-rt serve` scaled out over replicas (needs the [ray] extra).

Each replica is the very app of `jacobi-rt serve` (create_app) over the same Generator, hosted by
`serve.ingress` behind Ray's HTTP proxy (one per node), so there is no second server to keep in step:

    jacobi-rt serve build/smollm2-135m --ray --replicas 2 --threads 1          # a local Ray instance
    jacobi-rt serve /shared/smollm2-135m --ray --address auto --replicas 4     # a running cluster
    serve run jacobi_rt.server.ray_app:build artifact=/shared/smollm2-135m replicas=2 threads=1

What Ray adds, and how it maps onto the single server:
- A replica reserves `threads` CPUs and runs onnxruntime on that many threads. Ray sends it at most
  its places (its batcher's slots, + queue) + HEADROOM requests (`max_ongoing_requests`):
  a generation beyond its places gets the app's own 429 (OpenAI error, Retry-After), while /health
  and /metrics still get through. Requests Ray cannot place wait at the proxy, `queue` of them per
  proxy (`max_queued_requests`); beyond that Ray's back-pressure answers 429 with Retry-After too
  (its default would be 503 without one), with a plain-text body. So one client rule covers both
  and the single server: on 429 (or 503), wait Retry-After seconds and retry.
- With `max_replicas` the deployment autoscales between `replicas` and `max_replicas`, aiming at
  as many requests per replica as it runs at once (its batcher's slots; more wait in its queue).
- Every replica checks its copy of the artifact: the manifest's sha256 must be the one the
  deployment was made from (and, unless verify is off, every file's sha256 the manifest's); a
  replica on a node with another copy refuses to start, naming the node.
- With `mapped` (`serve --mapped`) each replica loads a mapped session (runtime/backends/ort_session.py): the first
  replica on a node makes the entry under its $JACOBI_RT_CACHE, and the replicas of a node share its pages.
- Every response carries `X-Jacobi-Replica` (the Ray replica id). GET /metrics through any proxy
  answers for every replica: each replica reports its own metrics to one MetricsHub every
  `REPORT_SECONDS` (and at once when it serves a scrape); the hub merges them, each sample labelled
  `replica` (metrics_merge.py); replicas silent for 3 periods drop out.
- A client that disconnects cancels its generation: Ray's proxy cancels the request on the replica,
  the app's stream or wait is cancelled and frees its slot, as in the single server.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import BackpressureConfig

from jacobi_rt.runtime import (
    MANIFEST_NAME,
    ArtifactError,
    DecodingConfig,
    Generator,
    InputError,
    JacobiError,
    manifest_sha256,
)

from .app import create_app
from .hosts import HostCheck
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics_merge import merge_expositions
from .settings import ServerSettings

APP_NAME = "jacobi-rt"
REPLICA_HEADER = "x-jacobi-replica"
REPORT_SECONDS = 2.0
HEADROOM = 4  # places beyond the pool's: /health, /metrics and a request the app refuses with its own 429 get through
CONSTRUCTOR_RETRIES = 2  # a refused artifact is refused again: fail the deployment quickly


def node_name() -> str:
    """This node as a user recognises it: host name and Ray's address for it."""
    import ray

    return f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"


@dataclass(frozen=True)
class PinnedArtifact:
    """An artifact folder and the sha256 of its manifest where the deployment was made."""

    path: str
    manifest_sha256: str

    @classmethod
    def of(cls, path: str | Path) -> PinnedArtifact:
        folder = Path(path).resolve()
        digest = manifest_sha256(folder)
        if digest is None:
            raise ArtifactError(f"{folder} has no {MANIFEST_NAME}: pass an artifact folder from `jacobi-rt export`")
        return cls(str(folder), digest)

    def check_on(self, node: str) -> None:
        """Raise ArtifactError naming `node` unless the same artifact is at the same path here."""
        found = manifest_sha256(self.path)
        if found is None:
            raise ArtifactError(
                f"node {node} has no artifact at {self.path}: every node needs the same artifact at this "
                "path (copy it there, or mount a shared store at that path)"
            )
        if found != self.manifest_sha256:
            raise ArtifactError(
                f"node {node} holds a different artifact at {self.path}: its {MANIFEST_NAME} has sha256 "
                f"{found[:16]}..., the deployment's {self.manifest_sha256[:16]}...; copy the deployed "
                "artifact to this node"
            )


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica loads and serves (pickled to the replicas)."""

    artifact: PinnedArtifact
    settings: ServerSettings
    threads: int = 1  # onnxruntime threads = the CPUs the replica reserves
    draft: PinnedArtifact | None = None
    backend: str = "cpu"
    verify: str = "sampled"  # how each replica checks the files at load: sampled, full or none (Generator.load)
    config: DecodingConfig | None = None  # the generator's decoding config (serve --decoding)
    prefix_cache: bool = True  # serve --no-prefix-cache: False
    mapped: bool = False  # a mapped session: the replicas of one host share the weights' pages (Generator.load)

    def load(self, node: str) -> Generator:
        try:
            for pinned in (self.artifact, self.draft):
                if pinned is not None:
                    pinned.check_on(node)
            return Generator.load(
                self.artifact.path,
                draft=self.draft and self.draft.path,
                backend=self.backend,
                threads=self.threads,
                verify=self.verify,
                config=self.config,
                prefix_cache=self.prefix_cache,
                mapped=self.mapped,
            )
        except JacobiError as exc:
            if str(exc).startswith(f"node {node}"):
                raise
            raise type(exc)(f"node {node}: {exc}") from exc


@dataclass(frozen=True)
class RayPlan:
    """The deployment's shape."""

    replicas: int = 1
    max_replicas: int | None = None  # autoscale between `replicas` and this
    queued: int | None = None  # requests each proxy may hold for the deployment; default settings.queue_size

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InputError(f"replicas must be at least 1, not {self.replicas}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise InputError(f"max_replicas ({self.max_replicas}) must be at least replicas ({self.replicas})")
        if self.queued is not None and self.queued < 0:
            raise InputError(f"queued must be 0 or more, not {self.queued}")


def max_ongoing_requests(settings: ServerSettings) -> int:
    """What Ray sends one replica at once: its running generations (the batcher's
    slots) plus its own queue (the single server's places), plus HEADROOM: a full replica still
    answers /health and /metrics, and answers a generation beyond its places with its own 429."""
    return settings.running_at_once + settings.queue_size + HEADROOM


def deployment_options(spec: ReplicaSpec, plan: RayPlan) -> dict[str, Any]:
    settings = spec.settings
    options: dict[str, Any] = dict(
        ray_actor_options={"num_cpus": spec.threads},
        max_ongoing_requests=max_ongoing_requests(settings),
        max_queued_requests=settings.queue_size if plan.queued is None else plan.queued,
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=settings.retry_after_seconds),
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
        graceful_shutdown_timeout_s=settings.shutdown_grace,
    )
    if plan.max_replicas is None or plan.max_replicas == plan.replicas:
        options["num_replicas"] = plan.replicas
    else:
        options["num_replicas"] = "auto"
        options["autoscaling_config"] = {
            "min_replicas": plan.replicas,
            "initial_replicas": plan.replicas,
            "max_replicas": plan.max_replicas,
            "target_ongoing_requests": settings.running_at_once,
        }
    return options


# -- the deployments ----------------------------------------------------------------------------


@serve.deployment(
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1000,
    logging_config={"enable_access_log": False},
)  # a report every 2 s per replica: not worth a log line
class MetricsHub:
    """Holds each replica's latest metrics text; renders them merged (one scrape covers every replica)."""

    def __init__(self, stale_after: float = 3 * REPORT_SECONDS):
        self.stale_after = stale_after
        self.reports: dict[str, tuple[float, bytes]] = {}

    def report(self, replica: str, text: bytes) -> None:
        self.reports[replica] = (time.monotonic(), text)

    def render(self) -> bytes:
        oldest = time.monotonic() - self.stale_after
        self.reports = {r: (t, text) for r, (t, text) in self.reports.items() if t >= oldest}
        return merge_expositions({r: text for r, (_, text) in self.reports.items()})


class ReplicaFront:
    """ASGI middleware around the app: tags every response with the replica id, and answers
    GET /metrics with every replica's metrics (from the hub) instead of this replica's alone."""

    def __init__(self, app, replica: str, metrics, allowed_hosts: tuple[str, ...]):
        self.app = app
        self.replica = replica.encode()
        self.metrics = HostCheck(self._metrics, allowed_hosts)
        self._all_metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), self.replica)]}
            await send(message)

        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            return await self.metrics(scope, receive, tagged)
        await self.app(scope, receive, tagged)

    async def _metrics(self, scope, receive, send) -> None:
        body = await self._all_metrics()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", METRICS_CONTENT_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})


@serve.deployment
@serve.ingress()
class JacobiReplica:
    """One replica: the Generator and `create_app` of `jacobi-rt serve`, fronted by ReplicaFront."""

    async def __init__(self, spec: ReplicaSpec, hub):
        self.node = node_name()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.spec, self.hub = spec, hub
        self.generator = await asyncio.to_thread(spec.load, self.node)
        self.server_app = create_app(self.generator, spec.settings)
        self._reporter = asyncio.get_running_loop().create_task(self._report_every(REPORT_SECONDS))

    def __serve_build_asgi_app__(self):
        return ReplicaFront(self.server_app, self.replica, self._all_metrics, self.spec.settings.allowed_hosts)

    def _own_metrics(self) -> bytes:
        return self.server_app.state.server.metrics.render()

    async def _report(self) -> None:
        await self.hub.report.remote(self.replica, self._own_metrics())

    async def _report_every(self, seconds: float) -> None:
        while True:
            try:
                await self._report()
            except Exception:  # the hub restarting: report again next period
                pass
            await asyncio.sleep(seconds)

    async def _all_metrics(self) -> bytes:
        try:
            await self._report()
            return await self.hub.render.remote()
        except Exception:  # no hub: this replica's own, still labelled
            return merge_expositions({self.replica: self._own_metrics()})


def application(spec: ReplicaSpec, plan: RayPlan):
    """The Ray Serve application (serve.run it, or return it from a builder)."""
    return JacobiReplica.options(**deployment_options(spec, plan)).bind(spec, MetricsHub.bind())


# -- starting it --------------------------------------------------------------------------------


def run(
    spec: ReplicaSpec,
    plan: RayPlan,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    name: str = APP_NAME,
):
    """Connect to Ray (address: a running cluster, e.g. "auto"; None: a local instance unless one is
    running in this process), start Serve's proxies on host:port and deploy; returns the handle."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    return serve.run(application(spec, plan), name=name, route_prefix="/")


# -- `serve run jacobi_rt.server.ray_app:build key=value ...` -------------------------------------

BUILD_ARGS = {
    "artifact": "the artifact folder (same path on every node)",
    "draft": "a draft artifact folder",
    "model_name": "the model id clients send (default: the artifact folder's name)",
    "replicas": "replicas (the minimum when autoscaling)",
    "max_replicas": "autoscale up to this many replicas",
    "threads": "CPUs per replica, and its onnxruntime threads",
    "max_batch": "generations sharing each pass, per replica (default: sized from the artifact and memory)",
    "batch_context": "each slot's context (prompt + output)",
    "queue": "requests waiting per replica (and per proxy)",
    "strategy": "default decoding strategy",
    "timeout": "seconds per request",
    "api_key": "require 'Authorization: Bearer KEY'",
    "allow_host": "comma-separated Host names clients use",
    "verify": "how each replica checks the files at load: sampled (default: size and sampled digests), full "
    "(every byte's sha256) or none",
    "mapped": "true: each replica maps the graph prepacked for its CPU (made once per node under $JACOBI_RT_CACHE): "
    "the replicas of a node share the weights' pages (default false)",
}


def build(args: Mapping[str, str]):
    """Ray's application builder: `serve run jacobi_rt.server.ray_app:build artifact=PATH replicas=2`."""
    unknown = sorted(set(args) - set(BUILD_ARGS))
    if unknown:
        raise InputError(
            f"unknown argument(s) {', '.join(unknown)}; known: " + "; ".join(f"{k}: {v}" for k, v in BUILD_ARGS.items())
        )
    if "artifact" not in args:
        raise InputError("pass artifact=PATH (an artifact folder at the same path on every node)")
    artifact = PinnedArtifact.of(args["artifact"])
    settings = ServerSettings(
        model_id=args.get("model_name") or Path(artifact.path).name,
        max_batch=int(args["max_batch"]) if args.get("max_batch") else None,
        batch_context=int(args["batch_context"]) if args.get("batch_context") else None,
        queue_size=int(args.get("queue", 32)),
        request_timeout=float(args.get("timeout", 300.0)),
        api_key=args.get("api_key") or None,
        default_strategy=args.get("strategy", "auto"),
        allowed_hosts=tuple(h for h in args.get("allow_host", "").split(",") if h),
    )
    spec = ReplicaSpec(
        artifact,
        settings,
        threads=int(args.get("threads", 1)),
        draft=PinnedArtifact.of(args["draft"]) if args.get("draft") else None,
        verify=_verify_arg(args.get("verify", "sampled")),
        mapped=_flag_arg("mapped", args.get("mapped", "false")),
    )
    max_replicas = args.get("max_replicas")
    return application(spec, RayPlan(int(args.get("replicas", 1)), int(max_replicas) if max_replicas else None))


FLAGS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}  # `serve run`'s spellings


def _flag_arg(name: str, value: str) -> bool:
    """A true/false argument of `serve run`."""
    flag = FLAGS.get(str(value).lower())
    if flag is None:
        raise InputError(f"{name} must be true or false, not {value!r}")
    return flag


def _verify_arg(value: str) -> str:
    """`verify=` of `serve run`: sampled, full or none (true and false, the older spellings, are sampled and none)."""
    mode = {True: "sampled", False: "none"}.get(FLAGS.get(str(value).lower()), str(value).lower())
    if mode not in ("sampled", "full", "none"):
        raise InputError(f"verify must be sampled, full or none, not {value!r}")
    return mode
