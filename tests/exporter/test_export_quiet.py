"""An export shows what concerns the user: torch.onnx's "torchvision is not installed" notices (four per
graph) are hidden while the exporter traces, and nothing else of that logger is."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from jacobi_rt.exporter.quiet import NOTICE, REGISTRY_LOGGER, torchvision_notices_hidden


@pytest.fixture(autouse=True)
def without_torchvision():
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed, so torch.onnx prints no notice about it")


class Seen(logging.Handler):
    """What the registry's logger lets through (its filters run before any handler)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, text: str) -> int:
        found = sum(text in m for m in self.messages)
        self.messages.clear()
        return found


@pytest.fixture
def seen():
    handler, logger = Seen(), logging.getLogger(REGISTRY_LOGGER)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_only_the_torchvision_notices_are_hidden(seen, tmp_path):
    import torch

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    def export(name: str) -> None:
        torch.onnx.export(Double(), (torch.ones(2),), str(tmp_path / name), dynamo=True, opset_version=18)

    export("loud.onnx")
    assert seen.count(NOTICE) == 4  # torch's own behaviour, so the test can fail
    with torchvision_notices_hidden():
        export("quiet.onnx")
        logging.getLogger(REGISTRY_LOGGER).warning("another notice of the registry")
    assert seen.messages == ["another notice of the registry"]
    seen.messages.clear()
    export("loud-again.onnx")
    assert seen.count(NOTICE) == 4  # the filter is gone after the block


def test_the_exporter_traces_without_the_notices(seen, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from jacobi_rt.exporter.graph.trace import export_onnx, probe

    model = AutoModelForCausalLM.from_pretrained(tiny_model("llama"), attn_implementation="eager").eval()
    export_onnx(model, probe(model), tmp_path / "model.onnx", 18)
    assert seen.count(NOTICE) == 0 and (tmp_path / "model.onnx").is_file()
