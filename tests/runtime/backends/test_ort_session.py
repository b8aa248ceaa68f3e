"""Mapped sessions (runtime/backends/ort_session.py): the graph prepacked for this CPU once, mapped at later loads.

A session from the cache must compute the bits of a session from the artifact, on both graphs and on
float and MatMulNBits (level 4) weights; an entry is made once, remade when the artifact changes, dropped
when it is broken, and never made with the cache off.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from make_artifacts import TINY_GGUF

from jacobi_rt.runtime import Generator
from jacobi_rt.runtime.backends import ort_session
from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.manifest import load_manifest


def load(folder, graph: str) -> OrtBackend:
    return OrtBackend(folder, load_manifest(folder), device="cpu", threads=1, graph=graph, mapped=True)


def entries(root) -> list:
    return sorted(p for p in (root / "sessions").iterdir() if not p.name.startswith("."))


def logits(backend: OrtBackend) -> np.ndarray:
    """A prefill, then a chain window of 5, with a branch in the mask: every row's logits."""
    vocab = backend.manifest.architecture.vocab_size
    tokens = (np.arange(1, 12, dtype=np.int64) * 7919) % vocab
    mask = np.tril(np.ones((5, 5), bool))
    if backend.limits.branches:
        mask[4, 2:4] = False  # the last node a side branch after the second
    with backend.context(32) as ctx:
        prefill = ctx.forward(tokens[None, :6], want_logits=True).logits
        ctx.commit(6)
        window = ctx.forward(tokens[None, 6:], np.arange(6, 11)[None], mask[None], want_logits=True).logits
    return np.concatenate([prefill, window], axis=1)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3", TINY_GGUF])
def test_a_mapped_session_computes_the_bits_of_the_artifacts_graph(artifact, graph, family, tmp_path, monkeypatch):
    folder = artifact(family)
    if graph == "inplace" and "inplace" not in load_manifest(folder).graphs:
        pytest.skip(f"the {family} artifact has no in-place graph")
    plain = load(folder, graph)
    assert plain.session_graph == folder / plain.manifest.graphs[graph]  # JACOBI_RT_CACHE=off (conftest)
    monkeypatch.setenv("JACOBI_RT_CACHE", str(tmp_path))
    unmapped = OrtBackend(folder, load_manifest(folder), device="cpu", threads=1, graph=graph)
    assert unmapped.session_graph == plain.session_graph  # mapped=False, the default: the artifact's graph
    mapped = load(folder, graph)
    assert mapped.session_graph.parent in entries(tmp_path)
    assert mapped.mapped and not unmapped.mapped and not plain.mapped
    assert np.array_equal(logits(mapped), logits(plain))
    assert mapped.rows.mode == plain.rows.mode


def test_the_first_load_makes_the_entry_and_the_next_loads_map_it(artifact, tmp_path, monkeypatch):
    """One entry per graph; a later load makes nothing (the entry's files are not rewritten) and generates the
    same tokens as a load without the cache, with every strategy."""
    folder = artifact("llama")
    reference = Generator.load(folder, graph="inplace", threads=1)
    monkeypatch.setenv("JACOBI_RT_CACHE", str(tmp_path))
    first = Generator.load(folder, graph="inplace", threads=1, mapped=True)
    [entry] = entries(tmp_path)
    written = (entry / ort_session.DATA).stat().st_mtime_ns
    again = Generator.load(folder, graph="inplace", threads=2, mapped=True)  # threads do not change what is packed
    assert entries(tmp_path) == [entry] and (entry / ort_session.DATA).stat().st_mtime_ns == written
    assert again.backend.session_graph == first.backend.session_graph == entry / ort_session.GRAPH
    for strategy in ("greedy", "jacobi", "lookahead"):
        expected = reference.generate("the cache", max_new_tokens=12, strategy=strategy).ids
        assert again.generate("the cache", max_new_tokens=12, strategy=strategy).ids == expected
    Generator.load(folder, graph="portable", threads=1, mapped=True)
    assert len(entries(tmp_path)) == 2


def test_a_broken_entry_is_dropped_and_the_artifacts_graph_loaded(artifact, tmp_path, monkeypatch):
    folder = artifact("llama")
    monkeypatch.setenv("JACOBI_RT_CACHE", str(tmp_path))
    [entry] = [load(folder, "portable").session_graph.parent]
    with open(entry / ort_session.DATA, "r+b") as data:
        data.truncate(100)
    with pytest.warns(UserWarning, match="did not load"):
        fallback = load(folder, "portable")
    assert fallback.session_graph == folder / fallback.manifest.graphs["portable"]
    assert not entry.exists()
    assert load(folder, "portable").session_graph == entry / ort_session.GRAPH  # made again


def test_an_artifact_exported_again_in_place_replaces_its_entry(artifact, tmp_path, monkeypatch):
    folder = tmp_path / "artifact"
    shutil.copytree(artifact("llama"), folder)
    cache = tmp_path / "cache"
    monkeypatch.setenv("JACOBI_RT_CACHE", str(cache))
    [old] = [load(folder, "portable").session_graph.parent]
    graph = folder / load_manifest(folder).graphs["portable"]
    graph.touch()  # as an export writes it anew (same digests here: the stats change the key)
    new = load(folder, "portable").session_graph.parent
    assert new != old and entries(cache) == [new]


def test_an_entry_that_cannot_be_made_leaves_the_load_as_it_was(artifact, tmp_path, monkeypatch):
    folder = artifact("llama")
    monkeypatch.setenv("JACOBI_RT_CACHE", str(tmp_path))

    def fails(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "MemoryError")

    monkeypatch.setattr(ort_session.subprocess, "run", fails)
    with pytest.warns(UserWarning, match="could not prepare a mapped session.*MemoryError"):
        backend = load(folder, "portable")
    assert backend.session_graph == folder / backend.manifest.graphs["portable"]
    assert entries(tmp_path) == []
