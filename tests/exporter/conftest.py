"""Fixtures for the exporter tests: tiny model folders and their artifacts, each built once per session.

Every tiny family is written once (`tiny_model`) and exported once (`tiny_artifact`: the prebuilt
artifact of JACOBI_RT_TEST_ARTIFACTS when there is one, as in CI, which tests/make_artifacts.py exported
from the same tiny model with the default options); tests that need a fresh export of their own
(failures, overwrite, quantization, progress) say so and pay for it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for folder in (TESTS, HERE):  # tiny_models.py and export_helpers.py, whatever pytest's import mode
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

pytest.importorskip(
    "torch", reason="the exporter tests need the export extras: pip install '.[export,cpu]' from the checkout"
)
pytest.importorskip(
    "transformers", reason="the exporter tests need the export extras: pip install '.[export,cpu]' from the checkout"
)
pytest.importorskip("onnxruntime", reason="the exporter tests need onnxruntime: pip install '.[cpu]' from the checkout")

from tiny_models import FAMILIES, make_tiny_model  # noqa: E402


@dataclass
class Exported:
    family: str
    model_dir: Path  # the Hugging Face folder that was exported
    artifact: Path  # the artifact folder export() wrote
    manifest: object  # the Manifest export() returned


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(family) -> a tiny random Hugging Face folder of that family, written once per session."""
    root = tmp_path_factory.mktemp("tiny-models")
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = make_tiny_model(family, root / family)
        return made[family]

    return get


@pytest.fixture(scope="session")
def tiny_artifact(tiny_model, tmp_path_factory):
    """tiny_artifact(family) -> Exported, from one fp32 export per family per session. Read it, don't write into it."""
    from jacobi_rt.exporter import export

    root = tmp_path_factory.mktemp("tiny-artifacts")
    done: dict[str, Exported] = {}

    def get(family: str) -> Exported:
        if family not in done:
            model_dir = tiny_model(family)
            folder, manifest = _prebuilt(family) or (root / family, export(str(model_dir), root / family))
            done[family] = Exported(family, model_dir, folder, manifest)
        return done[family]

    return get


def _prebuilt(family: str) -> tuple[Path, object] | None:
    """(folder, manifest) of JACOBI_RT_TEST_ARTIFACTS' artifact of `family`, when there is one."""
    from jacobi_rt.runtime.errors import ArtifactError
    from jacobi_rt.runtime.manifest import load_manifest

    prebuilt = os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
    if not prebuilt:
        return None
    try:
        return Path(prebuilt) / family, load_manifest(Path(prebuilt) / family, verify=False)
    except ArtifactError:
        return None


@pytest.fixture(scope="session", params=FAMILIES)
def exported(request, tiny_artifact) -> Exported:
    """Each tiny family, exported (once per session)."""
    return tiny_artifact(request.param)


@pytest.fixture(scope="session")
def hf_model():
    """hf_model(folder) -> the Hugging Face model itself (fp32, eval), loaded once: the independent reference."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = {}

    def get(folder: Path):
        if folder not in loaded:
            loaded[folder] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        return loaded[folder]

    return get


@pytest.fixture(scope="session")
def ort_session():
    """ort_session(artifact_folder) -> one onnxruntime CPU session per artifact, reused across tests."""
    import onnxruntime as ort

    sessions = {}

    def get(folder: Path):
        if folder not in sessions:
            sessions[folder] = ort.InferenceSession(
                str(Path(folder) / "model.onnx"), providers=["CPUExecutionProvider"]
            )
        return sessions[folder]

    return get
