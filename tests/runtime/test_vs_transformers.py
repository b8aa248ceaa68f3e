"""The runtime's greedy output equals transformers' greedy `generate` on the same tiny model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from make_artifacts import FAMILIES

torch = pytest.importorskip(
    "torch", reason="comparing with transformers needs torch (the exporter's venv); the runtime itself does not"
)
transformers = pytest.importorskip("transformers", reason="comparing with transformers needs the export extras")

PROMPTS = [[5, 17, 33, 90, 100, 7], list(range(40, 80))]


def artifact_of(source: Path, cached: Path, tmp: str) -> Path:
    """The session's artifact when it was exported from these very weights, else a fresh export."""
    from jacobi_rt.exporter import export, sources
    from jacobi_rt.runtime.manifest import load_manifest

    if load_manifest(cached, verify=False).source.get("sha256") == sources.resolve(str(source)).fingerprint():
        return cached
    return export(str(source), Path(tmp) / "art") and Path(tmp) / "art"


@pytest.mark.parametrize("family", FAMILIES)
def test_runtime_greedy_equals_transformers_greedy(family, artifact):
    import tiny_models

    from jacobi_rt.runtime import Generator

    with tempfile.TemporaryDirectory() as tmp:
        source = tiny_models.make_tiny_model(family, Path(tmp) / "hf")
        gen = Generator.load(artifact_of(source, artifact(family), tmp), threads=1)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=24,
                    eos_token_id=gen.manifest.tokens.eos_ids,
                    pad_token_id=0,
                )
            expected = out[0, len(prompt) :].tolist()
            assert gen.generate(prompt, max_new_tokens=24, strategy="greedy").ids == expected
            assert gen.generate(prompt, max_new_tokens=24, window=8).ids == expected
