"""Engine records: naming, the manifest round trip, and the refusal of engines this machine cannot run."""

from __future__ import annotations

import json
import shutil

import pytest
from manifests import H100, H200, L4, manifest, record

from jacobi_rt.engines.records import add_engine, engine_file
from jacobi_rt.runtime.backends.trt_plans import mismatches, same_version, select_engine, verify_engine_file
from jacobi_rt.runtime.errors import BackendError
from jacobi_rt.runtime.manifest import EngineRecord, load_manifest, sha256_file


def test_engine_files_are_named_after_gpu_architecture_and_precision():
    assert engine_file(H200, "fp16") == "engines/nvidia-h200-sm90-fp16.plan"
    assert engine_file(H100, "bf16") == "engines/nvidia-h100-80gb-hbm3-sm90-bf16.plan"


def test_versions_compare_on_major_minor_patch():
    assert same_version("10.8.0", "10.8.0.post1") and same_version("10.8.0.43", "10.8.0")
    assert not same_version("10.8.0", "10.9.0")


def test_a_matching_engine_has_no_mismatch():
    assert mismatches(record(H200), H200, "10.8.0") == []


def test_mismatches_name_both_sides():
    (cc,) = mismatches(record(L4), H200, "10.8.0")
    assert "compute capability 8.9 (NVIDIA L4)" in cc and "9.0 (NVIDIA H200)" in cc
    (version,) = mismatches(record(H200, tensorrt="10.3.0"), H200, "10.8.0")
    assert "TensorRT 10.3.0" in version and "TensorRT 10.8.0" in version
    assert len(mismatches(record(L4, tensorrt="10.3.0"), H200, "10.8.0")) == 2


def test_an_artifact_without_engines_says_how_to_build_one():
    with pytest.raises(
        BackendError, match=r"build/m has no TensorRT engine; build one with `jacobi-rt build build/m --precision fp16`"
    ):
        select_engine(manifest(), H200, "10.8.0", "build/m")
    with pytest.raises(
        BackendError, match=r"no bf16 TensorRT engine; build one with `jacobi-rt build build/m --precision bf16`"
    ):
        select_engine(manifest(engines=[record()]), H200, "10.8.0", "build/m", precision="bf16")


def test_an_engine_for_another_gpu_or_tensorrt_is_refused_with_the_rebuild_command():
    with pytest.raises(
        BackendError,
        match=r"compute capability 8.9.*rebuild it on this machine with `jacobi-rt build build/m --precision fp16`",
    ):
        select_engine(manifest(engines=[record(L4)]), H200, "10.8.0", "build/m")
    with pytest.raises(BackendError, match=r"built with TensorRT 10.3.0, this is TensorRT 10.8.0.*--precision bf16"):
        select_engine(manifest(engines=[record(H200, "10.3.0", "bf16")]), H200, "10.8.0", "build/m")


def test_the_newest_engine_that_runs_here_is_chosen():
    old, other, new = record(H200, file="a.plan"), record(L4, file="b.plan"), record(H200, file="c.plan")
    assert select_engine(manifest(engines=[old, other, new]), H200, "10.8.0", "m").file == "c.plan"
    assert select_engine(manifest(engines=[old, other]), H200, "10.8.0", "m").file == "a.plan"
    fp32 = record(H200, precision="fp32", file="d.plan")
    assert select_engine(manifest(engines=[fp32, new]), H200, "10.8.0", "m", precision="fp32").file == "d.plan"


def test_same_architecture_other_gpu_runs_with_a_warning():
    with pytest.warns(UserWarning, match="built on a NVIDIA H100.*runs on a NVIDIA H200"):
        assert select_engine(manifest(engines=[record(H100)]), H200, "10.8.0", "m").gpu_name == H100.name


@pytest.fixture
def folder(artifact, tmp_path):
    return shutil.copytree(artifact("llama"), tmp_path / "llama")


def test_engine_file_must_exist_and_be_unchanged(folder):
    rec = record(file="engines/x.plan")
    with pytest.raises(
        BackendError,
        match=r"engines/x.plan recorded in jacobi.json is missing; rebuild it on this machine with `jacobi-rt build",
    ):
        verify_engine_file(folder, rec)
    (folder / "engines").mkdir()
    (folder / "engines/x.plan").write_bytes(b"engine bytes")
    rec.sha256 = sha256_file(folder / "engines/x.plan")
    assert verify_engine_file(folder, rec) == folder / "engines/x.plan"
    (folder / "engines/x.plan").write_bytes(b"engine bytez")
    with pytest.raises(BackendError, match="changed after it was built.*`jacobi-rt build .* --precision fp16`"):
        verify_engine_file(folder, rec)


def test_records_round_trip_through_jacobi_json(folder):
    m = load_manifest(folder)
    assert m.engines == []
    add_engine(folder, m, record(file="engines/a.plan"))
    add_engine(folder, m, record(L4, file="engines/b.plan"))
    replaced = record(file="engines/a.plan", precision="bf16")
    add_engine(folder, m, replaced)
    again = load_manifest(folder)  # the other files' hashes still verify
    assert [type(r) for r in again.engines] == [EngineRecord, EngineRecord]
    assert [(r.file, r.precision) for r in again.engines] == [("engines/b.plan", "fp16"), ("engines/a.plan", "bf16")]
    assert again.engines[1] == replaced
    assert not list(folder.glob(".jacobi.json.partial*"))


def test_old_manifests_and_newer_records_still_load(folder):
    path = folder / "jacobi.json"
    data = json.loads(path.read_text())
    data.pop("engines", None)
    path.write_text(json.dumps(data))
    assert load_manifest(folder).engines == []
    data["engines"] = [{**record().__dict__, "a_field_from_the_future": 1}]
    path.write_text(json.dumps(data))
    assert load_manifest(folder).engines == [record()]
