"""Golden properties of the weight pass on tiny models, recorded from the in-memory pass it replaced.

`describe(folder)` reduces an artifact's graphs to digests: the float graph it was made from
(so that a changed float export is told apart from a changed pass), each quantized graph's nodes
(op, domain, name, inputs, outputs, attributes, in order), its initializers (name, type, dims and
the sha256 of the values, wherever they are stored), and the portable graph's outputs on fixed
feeds, plus the tokens `Generator.generate` gives. Equal initializer values and equal nodes are
equal graphs; their outputs are bitwise equal on machines whose CPUs take the same onnxruntime
kernels (1.32, one thread), but not across instruction sets: the int8-activation kernels of
MatMulNBits round differently on AVX2 and AVX-512 VNNI. So outputs and tokens are recorded per
`kernels()`, this CPU's kernel family.

    python tests/exporter/weight_golden.py            # (re)writes tests/exporter/data/weight_pass/*.json
    python tests/exporter/weight_golden.py --outputs  # adds this CPU's outputs and tokens (its graphs must match)
    python tests/exporter/weight_golden.py --digests  # new graph digests, every CPU's outputs kept: the float
                                                      # export changed its graphs' form, not what they compute
                                                      # (this CPU's outputs and tokens must match)
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "weight_pass"
PROMPT = [5, 17, 33, 2, 9]

# case -> (source: a tiny family, "name:layers" for more layers, or "gguf:TYPE[:tied][:v=TYPE]", options)
CASES = {
    "llama-int4": ("llama", {"quantize": "int4"}),
    "llama-mha-tied-int4": ("llama-mha-tied", {"quantize": "int4"}),  # the LM head through a folded Transpose
    "llama5-int8": ("llama-5layers", {"quantize": "int8"}),  # 5 layers: the graph is stitched
    "gguf-q4_1": ("gguf:Q4_1", {"weights": "gguf"}),  # offsets, permuted q/k rows
    "gguf-q8_0-tied": ("gguf:Q8_0:tied", {"weights": "gguf"}),  # GatherBlockQuantized sharing the head's blocks
    "gguf-q4_0-v-q8_0": ("gguf:Q4_0:v=Q8_0", {"weights": "gguf"}),  # packed q|k|v of two block layouts
}


def make_source(source: str, root: Path) -> Path:
    """The model (folder or .gguf) of a case, written under root."""
    sys.path[:0] = [str(HERE.parent)]
    from tiny_models import make_tiny_model

    parts = source.split(":")
    if parts[0] == "gguf":
        from tiny_gguf import LAYERS, write_tiny_gguf

        overrides = {f"blk.{i}.attn_v.weight": p[2:] for p in parts[2:] if p.startswith("v=") for i in range(LAYERS)}
        return write_tiny_gguf(
            root / f"{source.replace(':', '-')}.gguf", parts[1], tied="tied" in parts, overrides=overrides
        )
    return make_tiny_model(source, root / source)


def export_case(case: str, root: Path, base: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    """Export the case's float artifact, then its weight variant from those graphs; return (the variant's
    folder, the float artifact's). base: (model folder, its float artifact) already exported with the
    default options (a tiny model's session artifact, tests/exporter/conftest.py), used instead of
    exporting them again; the recorded float digests tell whether it is the same float export."""
    from jacobi_rt.exporter import ExportOptions, export

    source, options = CASES[case]
    if base is None:
        model, float_folder = make_source(source, root), root / "float"
        export(str(model), float_folder, ExportOptions())
    else:
        model, float_folder = base
    export(str(model), root / case, ExportOptions(graphs_from=str(float_folder), **options))
    return root / case, float_folder


def to_legacy_layout(folder: Path) -> None:
    """Rewrite an artifact as exports before the shared weights file wrote one: each graph's weights in
    a data file of its own (model.onnx.data, model-inplace.onnx.data), the manifest's records updated."""
    import onnx

    from jacobi_rt.runtime.file_digest import file_records

    manifest_path = folder / "jacobi.json"
    manifest = json.loads(manifest_path.read_text())
    for graph in dict.fromkeys(manifest["graphs"].values()):
        model = onnx.load(str(folder / graph))  # its weights read in from weights.data
        onnx.save_model(
            model,
            str(folder / graph),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{graph}.data",
            size_threshold=1024,
        )
    (folder / "weights.data").unlink()
    manifest_path.unlink()
    manifest["files"], manifest["samples"] = file_records(folder)
    manifest_path.write_text(json.dumps(manifest, indent=1))


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def graph_digests(path: Path) -> dict:
    """A graph file's nodes and initializers (values read wherever they are stored) as digests."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    nodes = [
        [
            n.op_type,
            n.domain,
            n.name,
            list(n.input),
            list(n.output),
            sorted((a.name, repr(helper.get_attribute_value(a))) for a in n.attribute),
        ]
        for n in model.graph.node
    ]
    inits = sorted(
        [i.name, i.data_type, list(i.dims), hashlib.sha256(numpy_helper.to_array(i).tobytes()).hexdigest()]
        for i in model.graph.initializer
    )
    return {
        "nodes": _digest(nodes),
        "node_count": len(nodes),
        "initializers": _digest(inits),
        "initializer_count": len(inits),
        "opsets": sorted([o.domain, o.version] for o in model.opset_import),
    }


def portable_feeds(arch, seed: int = 0) -> dict[str, np.ndarray]:
    """A window of 5 over a past of 7, two rows."""
    rng = np.random.default_rng(seed)
    batch, window, past = 2, 5, 7
    feeds = {
        "input_ids": rng.integers(0, arch.vocab_size, (batch, window)).astype(np.int64),
        "position_ids": np.tile(np.arange(past, past + window, dtype=np.int64), (batch, 1)),
        "attention_mask": np.ones((batch, past + window), np.int64),
        "window_mask": np.tile(np.tril(np.ones((window, window), bool)), (batch, 1, 1)),
    }
    for i in range(arch.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(
                (batch, arch.kv_heads, past, arch.head_dim)
            ).astype(np.float32)
    return feeds


def output_digests(folder: Path, arch) -> dict[str, str]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {
        name: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
        for name, v in zip(names, session.run(names, portable_feeds(arch)))
    }


KERNEL_ORDER = (
    "amx_int8",
    "avx512_vnni",
    "avx512f",
    "avx_vnni",
    "avx2",
    "i8mm",
    "asimddp",
    "asimd",
)  # most specific first


def kernels() -> str:
    """The instruction set that picks onnxruntime's int8 kernels on this CPU, e.g. "x86_64 avx512_vnni"."""
    from jacobi_rt.runtime.backends.exact_rows import cpuinfo

    fields = (cpuinfo() or [{}])[0]
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return f"{platform.machine()} {next((f for f in KERNEL_ORDER if f in flags), 'generic')}"


def describe(folder: Path, float_folder: Path) -> dict:
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.manifest import load_manifest

    manifest = load_manifest(folder)
    graphs = dict(manifest.graphs)
    generator = Generator.load(folder)
    return {
        "float": {role: graph_digests(float_folder / name) for role, name in graphs.items()},
        "graphs": {role: graph_digests(folder / name) for role, name in graphs.items()},
        "outputs": output_digests(folder, manifest.architecture),
        "tokens": list(generator.generate(PROMPT, max_new_tokens=8).ids),
    }


def main() -> None:
    import tempfile

    outputs_only, digests_only = "--outputs" in sys.argv, "--digests" in sys.argv
    DATA.mkdir(parents=True, exist_ok=True)
    for case in [a for a in sys.argv[1:] if not a.startswith("--")] or CASES:
        path = DATA / f"{case}.json"
        with tempfile.TemporaryDirectory() as tmp:
            folder, float_folder = export_case(case, Path(tmp))
            got = describe(folder, float_folder)
        record = (
            json.loads(path.read_text())
            if outputs_only or digests_only
            else {"float": got["float"], "graphs": got["graphs"], "outputs": {}, "tokens": {}}
        )
        if digests_only:
            before = (record["outputs"].get(kernels()), record["tokens"].get(kernels()))
            if before != (got["outputs"], got["tokens"]):
                raise SystemExit(f"{case}: this CPU's outputs or tokens changed: record everything again")
            record["float"], record["graphs"] = got["float"], got["graphs"]
        if (record["float"], record["graphs"]) != (got["float"], got["graphs"]):
            raise SystemExit(
                f"{case}: the graphs differ from the recorded ones: record everything again, not --outputs"
            )
        record["outputs"][kernels()], record["tokens"][kernels()] = got["outputs"], got["tokens"]
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print("wrote", case, kernels(), flush=True)


if __name__ == "__main__":
    main()
