"""Ray Serve (server/ray_app.py): the app of `jacobi-rt serve` as 2 replicas x 1 thread behind Ray's
HTTP proxy, on one local Ray instance with 2 CPUs started once for the module, over SmolLM2-135M
(slow enough on one thread that a request is still running when its client leaves or its replica
is killed). Traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray", reason="the Ray Serve tests need ray: pip install '.[serve,ray]' from the checkout")
pytest.importorskip(
    "ray.serve", reason="the Ray Serve tests need ray[serve]: pip install '.[serve,ray]' from the checkout"
)
openai = pytest.importorskip("openai", reason="the Ray Serve tests use the openai package (the dev extra)")
import httpx  # noqa: E402
from loopback import free_port  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from jacobi_rt.runtime.errors import ArtifactError, InputError  # noqa: E402
from jacobi_rt.server.settings import ServerSettings  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MODEL = "smollm2-135m"
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time", "def fibonacci(n):"]
TOKENS = 8


@pytest.fixture(scope="module")
def session_cache(tmp_path_factory):
    """The replicas' $JACOBI_RT_CACHE: they load mapped sessions (serve --mapped), made there once."""
    return tmp_path_factory.mktemp("replicas-cache")


@pytest.fixture(scope="module")
def ray_url(artifact, session_cache):
    from ray import serve

    from jacobi_rt.server.ray_app import PinnedArtifact, RayPlan, ReplicaSpec, run

    # Serve kills a proxy that is not ready within 5 s a check; on a loaded 2-core CI machine it can take longer
    # (every test errored at setup once, the proxy killed). Ray's workers inherit the driver's environment.
    with pytest.MonkeyPatch.context() as env:
        for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
            env.setenv(name, "60")
        env.setenv("JACOBI_RT_CACHE", str(session_cache))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        settings = ServerSettings(model_id=MODEL, max_batch=1, queue_size=16)
        spec = ReplicaSpec(PinnedArtifact.of(artifact(MODEL)), settings, threads=1, mapped=True)
        run(spec, RayPlan(replicas=2), host="127.0.0.1", port=port)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def expected(generator):
    """In-process greedy output of each prompt."""
    gen = generator(MODEL)
    return {p: gen.generate(p, TOKENS, strategy="greedy").text for p in PROMPTS}


def _api(url: str, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def _complete(url: str, prompt: str, max_tokens: int = TOKENS) -> tuple[str, str]:
    """(text, replica id) of one streamed completion through the openai client. Its timeout covers a burst of 16
    routed to one replica on a loaded 2-core machine (one CI run timed out at 60 s there; 45 s for the module alone)."""
    with _api(url, timeout=180) as api:
        raw = api.completions.with_raw_response.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_body={"jacobi": {"strategy": "greedy"}},
        )
        text = "".join(chunk.choices[0].text for chunk in raw.parse() if chunk.choices)
        return text, raw.headers["x-jacobi-replica"]


def _metric(url: str, name: str, **labels) -> float:
    """A sample summed over replicas (and any label not given)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _replicas_in_metrics(url: str) -> set[str]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        s.labels["replica"] for f in text_string_to_metric_families(text) for s in f.samples if "replica" in s.labels
    }


def _wait_until(condition, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not true within {seconds:g} s")
        time.sleep(0.2)


def _running_replicas() -> int:
    from ray import serve

    from jacobi_rt.server.ray_app import APP_NAME

    deployment = serve.status().applications[APP_NAME].deployments["JacobiReplica"]
    return deployment.replica_states.get("RUNNING", 0)


def test_16_openai_clients_get_greedy_output_from_both_replicas(ray_url, expected, session_cache):
    """Both replicas map the one session entry the first made (serve --mapped) and answer the tokens of the
    artifact's own session (`expected`, loaded in this process without the cache)."""
    assert len([p for p in (session_cache / "sessions").iterdir() if not p.name.startswith(".")]) == 1
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    replicas = set()
    for _ in range(3):  # Ray's router may send one burst to one replica (its queue-length view lags): try again
        with ThreadPoolExecutor(16) as clients:
            answers = list(clients.map(lambda p: _complete(ray_url, p), prompts, timeout=600))
        assert [text for text, _ in answers] == [expected[p] for p in prompts]
        replicas |= {replica for _, replica in answers}
        if len(replicas) == 2:
            break
    assert len(replicas) == 2
    # one scrape covers every replica (each sample labelled with its replica)
    _wait_until(lambda: _metric(ray_url, "jacobi_rt_generations_total", outcome="finished") >= 16)
    assert len(_replicas_in_metrics(ray_url)) == 2
    assert _metric(ray_url, "vllm:generation_tokens_total") >= 16 * TOKENS


def test_a_client_that_leaves_cancels_its_generation_through_the_proxy(ray_url):
    cancelled = _metric(ray_url, "jacobi_rt_generations_total", outcome="cancelled")
    tokens = _metric(ray_url, "vllm:generation_tokens_total")
    counting = {
        "model": MODEL,
        "prompt": "1, 2, 3, 4, 5, 6, 7, 8,",
        "max_tokens": 2000,
        "stream": True,
        "jacobi": {"strategy": "greedy"},
    }
    with httpx.Client(base_url=ray_url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=counting) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # generating (2000 tokens take minutes here)
        # the client left: Ray's proxy cancels the request on the replica, which stops the generation
    _wait_until(lambda: _metric(ray_url, "jacobi_rt_generations_total", outcome="cancelled") == cancelled + 1, 20)
    _wait_until(lambda: _metric(ray_url, "vllm:num_requests_running") == 0, 10)
    assert _metric(ray_url, "vllm:generation_tokens_total") == tokens  # a cancelled stream's tokens are not counted


def test_a_non_streamed_request_whose_client_leaves_is_cancelled(ray_url):
    cancelled = _metric(ray_url, "jacobi_rt_generations_total", outcome="cancelled")
    body = (
        b'{"model": "%s", "prompt": "1, 2, 3,", "max_tokens": 2000, "jacobi": {"strategy": "greedy"}}' % MODEL.encode()
    )
    port = int(ray_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as leaving:
        leaving.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        _wait_until(lambda: _metric(ray_url, "vllm:num_requests_running") == 1, 20)
    _wait_until(lambda: _metric(ray_url, "jacobi_rt_generations_total", outcome="cancelled") == cancelled + 1, 20)
    _wait_until(lambda: _metric(ray_url, "vllm:num_requests_running") == 0, 10)


def test_killing_a_replica_mid_load_fails_only_its_requests_and_ray_restarts_it(ray_url, expected):
    from jacobi_rt.server.ray_app import APP_NAME

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    started: list[str] = []

    def one(prompt: str, stream: bool = True):
        """('ok', text, replica) or ('failed', error text, replica or None); never hangs (client timeout)."""
        replica = None
        try:
            with _api(ray_url, timeout=120) as api:
                raw = api.completions.with_raw_response.create(
                    model=MODEL,
                    prompt=prompt,
                    max_tokens=24,
                    temperature=0,
                    stream=stream,
                    extra_body={"jacobi": {"strategy": "greedy"}},
                )
                replica = raw.headers["x-jacobi-replica"]
                if not stream:
                    return "ok", raw.parse().choices[0].text, replica
                started.append(replica)
                text = "".join(chunk.choices[0].text for chunk in raw.parse() if chunk.choices)
            return "ok", text, replica
        except (openai.APIError, httpx.HTTPError) as exc:
            return "failed", f"{type(exc).__name__}: {exc}", replica

    with ThreadPoolExecutor(10) as clients:
        futures = [clients.submit(one, p) for p in prompts]
        whole = [
            clients.submit(one, p, False) for p in PROMPTS[:2]
        ]  # non-streamed: the replica is known only at the end
        _wait_until(lambda: len(set(started)) == 2, 60)  # both replicas are streaming
        victim = started[0]
        name = next(
            n["name"] for n in ray.util.list_named_actors(all_namespaces=True) if n["name"].endswith("#" + victim)
        )
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        outcomes = [f.result(timeout=180) for f in futures]  # none hangs
        whole_outcomes = [f.result(timeout=180) for f in whole]

    for prompt, (status, text, _replica) in zip(PROMPTS[:2], whole_outcomes):
        # done (on either replica), or failed with a server or connection error (it was on the killed one)
        assert (
            (status == "ok" and text.startswith(expected[prompt]))
            or "InternalServerError" in text
            or "APIConnectionError" in text
            or "APIStatusError" in text
        ), text
    print("non-streamed requests:", whole_outcomes)
    for prompt, (status, text, replica) in zip(prompts, outcomes):
        if (
            replica is None
        ):  # refused before its headers: it may have been queued on the victim (a slow machine queues more)
            assert "InternalServerError" in text or "APIConnectionError" in text or "APIStatusError" in text, text
        elif replica != victim:
            assert status == "ok", text  # every request on the other replica completes
            assert text.startswith(expected[prompt])  # 24 tokens: the first 8 are the reference's
        else:
            assert status == "failed" or text.startswith(
                expected[prompt]
            )  # cut off with an error, or done before the kill
    assert any(status == "failed" for status, _, _ in outcomes)

    print("the killed replica's clients saw:", [text for status, text, _ in outcomes if status == "failed"][:2])

    # Ray starts a new replica in its place: two replicas answer again, the victim not among them
    survivor = next(replica for _, _, replica in outcomes if replica not in (victim, None))
    seen: set[str] = set()
    end = time.monotonic() + 120
    with ThreadPoolExecutor(4) as clients:
        while len(seen - {victim}) < 2 and time.monotonic() < end:
            answers = list(clients.map(lambda p: _complete(ray_url, p), PROMPTS, timeout=120))
            assert [text for text, _ in answers] == [expected[p] for p in PROMPTS]
            seen |= {replica for _, replica in answers}
    assert victim not in seen and survivor in seen and len(seen) == 2, seen
    assert _running_replicas() == 2 and APP_NAME in ray.serve.status().applications


def test_a_node_with_a_different_artifact_is_refused_by_name(artifact, tmp_path):
    """The check each replica runs on load: another copy of the manifest at the path, or none."""
    import shutil

    from jacobi_rt.server.ray_app import PinnedArtifact, ReplicaSpec

    copy = tmp_path / "llama"
    shutil.copytree(artifact("llama"), copy)
    pinned = PinnedArtifact.of(copy)
    pinned.check_on("node-a")
    manifest = copy / "jacobi.json"
    manifest.write_text(manifest.read_text().replace("{", "{ ", 1))
    with pytest.raises(ArtifactError, match="node node-a holds a different artifact"):
        pinned.check_on("node-a")
    with pytest.raises(ArtifactError, match="node node-a holds a different artifact"):  # what a replica runs first
        ReplicaSpec(pinned, ServerSettings(model_id="llama")).load("node-a")
    shutil.rmtree(copy)
    with pytest.raises(ArtifactError, match="node node-b has no artifact at"):
        pinned.check_on("node-b")


def test_serve_runs_mapped_argument_is_a_flag():
    """`serve run ... mapped=true` reaches each replica's Generator.load; anything but true/false is refused."""
    from jacobi_rt.server.ray_app import _flag_arg

    assert [_flag_arg("mapped", v) for v in ("true", "False", "1", "no")] == [True, False, True, False]
    with pytest.raises(InputError, match="mapped must be true or false, not 'sometimes'"):
        _flag_arg("mapped", "sometimes")


def test_serve_runs_verify_argument_is_a_load_mode(artifact):
    """`serve run ... verify=MODE` reaches each replica's Generator.load as sampled, full or none; the older
    true/false spellings mean sampled and none; anything else is refused before a replica starts."""
    from jacobi_rt.server.ray_app import PinnedArtifact, ReplicaSpec, _verify_arg

    assert [_verify_arg(v) for v in ("sampled", "FULL", "none", "true", "false", "0")] == [
        "sampled",
        "full",
        "none",
        "sampled",
        "none",
        "none",
    ]
    with pytest.raises(InputError, match="verify must be sampled, full or none"):
        _verify_arg("every")
    spec = ReplicaSpec(PinnedArtifact.of(artifact("llama")), ServerSettings(model_id="llama"), verify="full")
    assert spec.load("node-a").manifest.architecture.num_layers > 0  # a full check of every file, then loaded


def test_a_full_deployment_answers_429_with_retry_after_and_still_serves_metrics(ray_url):
    """Each replica takes 1 running + 16 queued generations; more requests, one by one, until one is
    refused at once with 429 and Retry-After; /health and /metrics still answer (the replicas' headroom)."""
    body = b'{"model": "%s", "prompt": "1, 2, 3,", "max_tokens": 2000, "stream": true}' % MODEL.encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    port = int(ray_url.rsplit(":", 1)[1])
    holding, statuses = [], []
    try:
        while len(holding) < 60:
            holding.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            holding[-1].sendall(request)
            head = holding[-1].recv(4096).decode("latin-1")  # a stream's headers come at once, queued or running
            statuses.append(int(head.split()[1]))
            if statuses[-1] != 200:
                break
        assert statuses[-1] == 429 and "retry-after: 1" in head.lower(), head
        assert len(statuses) > 17  # a whole replica's places at least
        print(f"admitted {len(statuses) - 1} before the 429")
        assert httpx.get(ray_url + "/health", timeout=10).status_code == 200
        _wait_until(
            lambda: _metric(ray_url, "vllm:num_requests_running") == 2, 10
        )  # other replicas' reports: <= 2 s old
    finally:
        for s in holding:
            s.close()
    _wait_until(
        lambda: _metric(ray_url, "vllm:num_requests_waiting") + _metric(ray_url, "vllm:num_requests_running") == 0, 30
    )
