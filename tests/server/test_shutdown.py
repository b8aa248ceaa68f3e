"""Graceful shutdown: in-flight requests finish within the grace period, or are cancelled after it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from sse_client import read_events, streamed_text


def test_shutdown_lets_an_in_flight_stream_finish(start_server, generator):
    server = start_server(shutdown_grace=30)
    expected = generator("llama").generate("The quick", 200, strategy="greedy").text
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream(
            "POST",
            "/v1/completions",
            json={"prompt": "The quick", "max_tokens": 200, "stream": True, "jacobi": {"strategy": "greedy"}},
        ) as response:
            lines = response.iter_lines()
            first = next(lines)
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            events, done = read_events(_Lines([first, *lines]))
        stopper.join(30)
    assert done and streamed_text(events) == expected
    assert server.stopped
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


@pytest.mark.slow
def test_shutdown_cancels_what_outlives_the_grace_period(start_server):
    server = start_server("smollm2-135m", shutdown_grace=0.5)
    counting = {
        "prompt": "1, 2, 3, 4, 5, 6, 7, 8,",
        "max_tokens": 500,
        "stream": True,
        "jacobi": {"strategy": "greedy"},
    }
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=counting) as response:
            lines = response.iter_lines()
            next(lines)
            started = time.monotonic()
            server.stop()
            assert time.monotonic() - started < 10  # not the tens of seconds 500 tokens take
            with pytest.raises(httpx.HTTPError):  # the stream is cut, without [DONE]
                for line in lines:
                    assert line != "data: [DONE]"
    assert server.stopped


class _Lines:
    """Lets read_events() read lines already taken from a response."""

    def __init__(self, lines):
        self.lines = lines

    def iter_lines(self):
        return iter(self.lines)
