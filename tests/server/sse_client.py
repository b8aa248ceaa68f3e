"""Reading OpenAI-style server-sent events in the tests."""

from __future__ import annotations

import json


def read_events(response) -> tuple[list[dict], bool]:
    """(the JSON events, whether `data: [DONE]` ended the stream) of a streamed httpx response."""
    events, done = [], False
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            continue
        assert not done, "an event after [DONE]"
        events.append(json.loads(data))
    return events, done


def stream(client, path: str, body: dict) -> tuple[list[dict], bool]:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_events(response)


def streamed_text(events: list[dict]) -> str:
    parts = []
    for event in events:
        for choice in event["choices"]:
            parts.append(choice["delta"].get("content", "") if "delta" in choice else choice["text"])
    return "".join(parts)
