"""An export interrupted between --overwrite's two renames leaves the old artifact at `.NAME.old-PID`
and nothing at NAME: the next export puts it back (and deletes other leftovers of dead processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jacobi_rt.exporter.destination import recover_interrupted
from jacobi_rt.runtime.errors import OptionError


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def artifact_at(folder, marker: str):
    folder.mkdir(parents=True)
    (folder / "jacobi.json").write_text(json.dumps({"marker": marker}))
    return folder


def test_a_stranded_old_artifact_is_put_back(tmp_path, dead_pid):
    out = tmp_path / "artifact"
    artifact_at(tmp_path / f".artifact.old-{dead_pid}", "old")
    (notes,) = recover_interrupted(out)
    assert "restored the artifact" in notes and f"process {dead_pid}" in notes
    assert json.loads((out / "jacobi.json").read_text()) == {"marker": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_leftovers_beside_a_complete_artifact_are_removed(tmp_path, dead_pid):
    out = artifact_at(tmp_path / "artifact", "new")
    artifact_at(tmp_path / f".artifact.old-{dead_pid}", "old")  # killed while deleting the old one
    (tmp_path / f".artifact.partial-{dead_pid}").mkdir()  # killed during an export
    assert len(recover_interrupted(out)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]
    assert json.loads((out / "jacobi.json").read_text()) == {"marker": "new"}


def test_leftovers_of_running_exports_and_other_names_are_left_alone(tmp_path):
    out = tmp_path / "artifact"
    keep = [
        artifact_at(tmp_path / f".artifact.old-{os.getpid()}", "mine"),
        tmp_path / ".artifact.partial-x",
        tmp_path / ".artifact2.old-1",
        tmp_path / ".other.partial-1",
    ]
    for folder in keep[1:]:
        folder.mkdir()
    assert recover_interrupted(out) == []
    assert all(folder.exists() for folder in keep) and not out.exists()


def test_the_next_export_recovers_before_looking_at_the_destination(tmp_path, dead_pid):
    from jacobi_rt.exporter import export

    out = tmp_path / "artifact"
    artifact_at(tmp_path / f".artifact.old-{dead_pid}", "old")
    with pytest.warns(UserWarning, match="restored the artifact"), pytest.raises(OptionError, match="already exists"):
        export("no-such-model", out)  # without overwrite: the restored artifact is kept
    assert json.loads((out / "jacobi.json").read_text()) == {"marker": "old"}
