"""A weight variant from an exported artifact's checked graphs, without tracing again.

Tracing and checking SmolLM2-135M's two graphs takes minutes; a weight pass (`quantize`, a
GGUF's blocks) takes under one. An artifact of the same source exported with float weights
(same layers, dtype, opset and context, by this jacobi-rt) holds exactly the graphs this export
would trace and check, so its graph files are re-hashed against its manifest, copied, and only
the weight pass runs on the copies.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from jacobi_rt import __version__
from jacobi_rt.runtime.errors import ArtifactError, OptionError
from jacobi_rt.runtime.manifest import read_manifest, verify_files
from jacobi_rt.runtime.spec import INPLACE, PORTABLE

from .options import ExportOptions
from .weights.graph_weights import data_files


def reuse_graphs(
    base: Path, folder: Path, source_info: dict, options: ExportOptions, max_context: int
) -> tuple[dict[str, str], dict]:
    """Copy `base`'s graph files into `folder`; return the manifest's `graphs` and the checks they passed."""
    try:
        manifest = read_manifest(base)
    except ArtifactError as exc:
        raise OptionError(f"`graphs_from`: {exc}", "graphs_from") from exc
    expected = {
        "source weights (sha256)": (manifest.source.get("sha256"), source_info["sha256"]),
        "kept layers": (manifest.source.get("kept_layers"), source_info.get("kept_layers")),
        "dtype": (manifest.dtype, options.torch_dtype),
        "opset": (manifest.opset, options.opset),
        "max_context": (manifest.max_context, max_context),
        "quantization": (manifest.quantization, None),
        "exporter": (manifest.created.get("tool"), f"jacobi-rt {__version__}"),
    }
    for what, (theirs, ours) in expected.items():
        if theirs != ours:
            raise OptionError(
                f"`graphs_from` {base} has {what} {theirs!r}, but this export needs {ours!r}: "
                "it must be a float-weights export of the same model with the same options; "
                "export without `graphs_from`, or pick a matching artifact",
                "graphs_from",
            )
    graphs = dict(manifest.graphs) if options.inplace else {PORTABLE: manifest.graphs[PORTABLE]}
    names = list(dict.fromkeys(graphs.values()))
    verify_files(base, manifest, names)
    data = list(
        dict.fromkeys(d for name in names for d in data_files(base / name))
    )  # weights.data once, or each legacy NAME.data
    missing = [d for d in data if d not in manifest.files]
    if missing:
        raise ArtifactError(
            f"{base}'s graphs read {', '.join(missing)}, which its manifest does not list; export it again"
        )
    verify_files(base, manifest, data)
    for name in names + data:
        shutil.copyfile(base / name, folder / name)
    check = {"vs_pytorch": manifest.check["vs_pytorch"]}
    if options.inplace and INPLACE in manifest.check:  # its check, or why the family has no in-place graph
        check[INPLACE] = manifest.check[INPLACE]
    return graphs, check
