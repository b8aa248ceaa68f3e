"""jacobi.json is checked before anything it names is opened: field types (an error naming the field,
not a traceback), file names confined to the artifact folder, and every opened file listed and hashed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from jacobi_rt.runtime import ArtifactError, Generator
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.manifest_checks import confined


@pytest.fixture
def copy(artifact, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(artifact("llama"), folder)
    return folder


def edit(folder, change) -> None:
    path = folder / "jacobi.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize(
    "name, ok",
    [
        ("model.onnx", True),
        ("engines/a-sm90-fp16.plan", True),
        ("sub/../model.onnx", False),
        ("../x", False),
        ("/etc/hostname", False),
        ("C:\\x", False),
        ("C:x", False),
        ("..\\x", False),
        ("\\\\server\\share\\x", False),
        ("", False),
    ],
)
def test_confined_names(name, ok):
    assert confined(name) is ok


@pytest.mark.parametrize("verify", [True, False])
def test_a_chat_template_outside_the_folder_is_refused_even_when_listed(copy, tmp_path, verify):
    secret = tmp_path / "secret.txt"
    secret.write_text("host-name")

    def point_outside(data):
        data["tokenizer"]["chat_template"] = str(secret)
        data["files"][str(secret)] = sha256(secret)

    edit(copy, point_outside)
    with pytest.raises(ArtifactError, match="outside the artifact folder"):
        Generator.load(copy, verify=verify)


@pytest.mark.parametrize("field", ["graph", "tokenizer", "engine"])
def test_dot_dot_and_absolute_names_are_refused(copy, field):
    def escape(data):
        if field == "graph":
            data["graphs"]["portable"] = "../llama/model.onnx"
        elif field == "tokenizer":
            data["tokenizer"]["file"] = "/tmp/tokenizer.json"
        else:
            data["engines"] = [
                {
                    "file": "../../engine.plan",
                    "sha256": "0" * 64,
                    "precision": "fp16",
                    "tensorrt_version": "10.8.0",
                    "gpu_name": "NVIDIA H200",
                    "compute_capability": "9.0",
                    "profiles": [],
                    "build_seconds": 1.0,
                }
            ]

    edit(copy, escape)
    with pytest.raises(ArtifactError, match="outside the artifact folder"):
        load_manifest(copy, verify=False)


def test_an_opened_file_must_be_listed_in_files(copy):
    shutil.copy(copy / "chat_template.jinja", copy / "other.jinja")

    def unlisted(data):
        data["tokenizer"]["chat_template"] = "other.jinja"

    edit(copy, unlisted)
    with pytest.raises(ArtifactError, match="other.jinja' but does not list it in `files`"):
        load_manifest(copy, verify=False)


def test_a_symbolic_link_out_of_the_folder_is_refused(copy, tmp_path):
    outside = tmp_path / "outside.jinja"
    outside.write_text("{{ 'leaked' }}")
    (copy / "chat_template.jinja").unlink()
    os.symlink(outside, copy / "chat_template.jinja")
    edit(copy, lambda data: data["files"].update({"chat_template.jinja": sha256(outside)}))
    with pytest.raises(ArtifactError, match="leads outside the artifact folder"):
        Generator.load(copy)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.update(files=list(d["files"])), "`files` must be an object mapping file names to sha256 strings"),
        (lambda d: d.update(max_context="8192"), "`max_context` must be a positive integer"),
        (lambda d: d.update(graphs={"inplace": "model.onnx"}), '"portable" graph'),
        (lambda d: d["architecture"].update(num_layers="2"), "`architecture.num_layers` must be a positive integer"),
        (lambda d: d["tokens"].update(eos_ids=2), "`tokens.eos_ids` must be a list of integers"),
        (lambda d: d["tokenizer"].update(chat_template=["a"]), "`tokenizer.chat_template` must be a string or null"),
        (lambda d: d.update(engines={"file": "x"}), "`engines` must be a list"),
        (lambda d: d.update(role="teacher"), '`role` must be "target" or "draft"'),
    ],
)
def test_fields_of_the_wrong_type_name_the_field(copy, change, field):
    edit(copy, change)
    with pytest.raises(ArtifactError, match="wrong type") as error:
        load_manifest(copy, verify=False)
    assert field in str(error.value)
