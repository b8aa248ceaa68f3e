"""The OpenAPI document (`serve --docs`): the real request bodies and answers, every status the routes return,
and none FastAPI would add on its own (422); the bodies it documents are still the server's own 400s."""

from __future__ import annotations

import httpx
import pytest

from jacobi_rt.server.run import BackgroundServer
from jacobi_rt.server.settings import ServerSettings

GENERATING = {
    "/v1/chat/completions": "ChatRequest",
    "/v1/completions": "CompletionRequest",
    "/v1/responses": "ResponsesRequest",
}


@pytest.fixture(scope="module")
def served(generator):
    with BackgroundServer(generator("llama"), ServerSettings(model_id="llama", docs=True, api_key="k")) as server:
        yield server


@pytest.fixture(scope="module")
def document(served) -> dict:
    return httpx.get(served.url + "/openapi.json", timeout=30).json()


def _schema(document: dict, ref: dict) -> dict:
    return document["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]


@pytest.mark.parametrize("path", GENERATING)
def test_each_generating_route_declares_its_body_answer_and_statuses(document, path):
    operation = document["paths"][path]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith(GENERATING[path])
    schema = _schema(document, body)
    assert schema["additionalProperties"] is False and "temperature" in schema["properties"]
    assert set(operation["responses"]) == {"200", "400", "401", "403", "404", "413", "415", "429", "500", "503", "504"}
    ok = operation["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"} and _schema(document, ok["application/json"]["schema"])
    assert _schema(document, operation["responses"]["400"]["content"]["application/json"]["schema"])["required"] == [
        "error"
    ]
    assert "Retry-After" in operation["responses"]["429"]["headers"]


def test_no_route_documents_fastapis_422_and_every_ref_resolves(document):
    for path, methods in document["paths"].items():
        for operation in methods.values():
            assert "422" not in operation["responses"], path
    for method, path in (
        ("get", "/v1/models/{model}"),
        ("get", "/v1/responses/{response_id}"),
        ("delete", "/v1/responses/{response_id}"),
    ):
        assert set(document["paths"][path][method]["responses"]) == {"200", "401", "403", "404"}, (method, path)
    text, schemas = str(document), document["components"]["schemas"]
    for name in {part.split("'")[0] for part in text.split("#/components/schemas/")[1:]}:
        assert name in schemas, name
    assert "$defs" not in text


def test_documented_refusals_stay_the_servers_own_400s(served, document):
    chat = _schema(document, {"$ref": "#/ChatRequest"})["properties"]
    assert chat["logit_bias"]["anyOf"][0]["maxProperties"] == 0 and chat["model"]["anyOf"][0]["enum"] == ["llama"]
    headers = {"Authorization": "Bearer k"}
    reply = httpx.post(
        served.url + "/v1/chat/completions",
        headers=headers,
        timeout=60,
        json={"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"},
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "temperature"
    missing = httpx.get(served.url + "/v1/models/nope", headers=headers, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    falsy = httpx.post(
        served.url + "/v1/responses", headers=headers, timeout=60, json={"input": "Hi", "text": {"format": False}}
    )  # only null or absent mean text
    assert falsy.status_code == 400 and falsy.json()["error"]["param"] == "text.format.type"
