"""TensorRT on a real GPU: the build and its record, the device-resident cache, exactness of every
strategy (greedy of the same engine), and the refusal of changed or foreign engines."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from exactness import assert_cache_round_trip, assert_side_branches_stay_greedy, assert_strategies_equal_greedy

from jacobi_rt.runtime.backends.cuda import gpu_facts
from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.backends.tensorrt import TrtBackend, load_tensorrt
from jacobi_rt.runtime.errors import BackendError
from jacobi_rt.runtime.manifest import load_manifest, sha256_file

pytestmark = pytest.mark.gpu
SMOL_PROMPTS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain what a hash table is and when to use one."}],
]


def backends(folder):
    manifest = load_manifest(folder)
    return TrtBackend(folder, manifest), OrtBackend(folder, manifest, device="cpu")


def test_build_records_the_engine_and_its_check(trt_artifact):
    folder = trt_artifact("llama")
    (record,) = load_manifest(folder).engines
    gpu = gpu_facts()
    assert (record.gpu_name, record.compute_capability, record.precision) == (gpu.name, gpu.compute_capability, "fp32")
    assert record.tensorrt_version == load_tensorrt().__version__ and record.sha256 == sha256_file(folder / record.file)
    assert [p["name"] for p in record.profiles] == ["decode", "prefill"] and record.build_seconds > 0
    assert record.check["reference"] == "onnxruntime-cpu" and record.check["positions"] > 0
    assert record.check["max_logit_diff"] < 1e-2 and record.check["greedy_agreement"] >= 0.99


def test_cache_round_trip_on_the_device(trt_artifact):
    engine, reference = backends(trt_artifact("llama"))
    assert_cache_round_trip(engine, reference, atol=1e-3, logit_atol=1e-2)


def test_side_branches_gather_on_the_device(trt_artifact):
    assert_side_branches_stay_greedy(backends(trt_artifact("llama"))[0])


def test_profiles_switch_between_prefill_and_decode(trt_artifact):
    engine, _ = backends(trt_artifact("llama"))
    with engine.context(128) as ctx:
        ctx.forward(np.arange(40)[None] % 300 + 3)
        assert engine.profiles[ctx._profile].name == "prefill"
        ctx.commit(40)
        out = ctx.forward(np.array([[7]]))
        assert engine.profiles[ctx._profile].name == "decode" and out.greedy_ids.shape == (1, 1)
        ctx.commit(1)


def test_every_strategy_equals_greedy_of_the_same_engine(trt_artifact):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(trt_artifact("llama"), draft=trt_artifact("llama-draft1"), backend="tensorrt")
    assert gen.backend.name == "tensorrt-fp32"
    assert_strategies_equal_greedy(gen, draft=True)


def test_smollm2_fp16_every_strategy_equals_greedy(trt_artifact):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(
        trt_artifact("smollm2-135m", "fp16"), draft=trt_artifact("smollm2-135m-draft6", "fp16"), backend="tensorrt"
    )
    assert_strategies_equal_greedy(gen, prompts=SMOL_PROMPTS, new=64, draft=True)


def test_changed_or_foreign_engines_are_refused(trt_artifact, tmp_path):
    from jacobi_rt.runtime import Generator

    folder = shutil.copytree(trt_artifact("llama"), tmp_path / "llama", symlinks=True)
    manifest = json.loads((folder / "jacobi.json").read_text())
    record = manifest["engines"][0]
    record["compute_capability"] = "1.0"
    (folder / "jacobi.json").write_text(json.dumps(manifest))
    with pytest.raises(BackendError, match=r"compute capability 1.0.*rebuild it on this machine with `jacobi-rt build"):
        Generator.load(folder, backend="tensorrt")
    record["compute_capability"], record["tensorrt_version"] = gpu_facts().compute_capability, "9.9.9"
    (folder / "jacobi.json").write_text(json.dumps(manifest))
    with pytest.raises(BackendError, match=r"built with TensorRT 9.9.9"):
        Generator.load(folder, backend="tensorrt")
    record["tensorrt_version"] = load_tensorrt().__version__
    (folder / "jacobi.json").write_text(json.dumps(manifest))
    engine = folder / record["file"]
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.unlink()  # a real file now, not the link to the shared engine
    engine.write_bytes(bytes(data))
    with pytest.raises(BackendError, match=r"changed after it was built.*`jacobi-rt build .* --precision fp32`"):
        Generator.load(folder, backend="tensorrt")
