"""Load time, peak RSS and tokens/s of an artifact whose weights sit in external data, per layout and session option.

    python -m benchmarks.external_data_bench /work/artifacts/smollm2-135m --work /tmp/xd --out docs/bench/x.json

Each variant copies the artifact with its graphs' initializers moved to `<graph>.data` (tensors of
1 KiB or more, offsets aligned to 1, 4096 or 65536 bytes), re-records its files, and runs
`Generator.load` + one greedy generation in a fresh process for each set of onnxruntime session
config entries (none; `session.disable_prepacking`), reporting the load seconds, the process's
peak RSS (ru_maxrss), its anonymous and file-backed (mapped) resident memory after loading and
after generating (/proc/self/status RssAnon, RssFile) and decode tokens/s. The artifact's own
(embedded) graphs run as the baseline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

OPTIONS = {"default": {}, "no-prepack": {"session.disable_prepacking": "1"}}

_RUN = """
import json, resource, sys, time
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") \
if line.startswith(("RssAnon", "RssFile", "VmHWM")))
    return {k: int(v.split()[0]) * 1024 for k, v in fields.items()}
from jacobi_rt.runtime.backends import onnxrt
entries = json.loads(sys.argv[2])
plain = onnxrt.session_options
def with_entries(ort, threads):
    options = plain(ort, threads)
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    return options
onnxrt.session_options = with_entries
from jacobi_rt.runtime import Generator
start = time.perf_counter()
gen = Generator.load(sys.argv[1], threads=2, verify="sampled", prefix_cache=False)
load = time.perf_counter() - start
rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
loaded = status()
out = gen.generate("Write a story about a lighthouse keeper.", int(sys.argv[3]), strategy="greedy", chat=True)
print(json.dumps({"load_s": round(load, 2), "peak_rss_after_load": rss_loaded,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "tokens_per_s": round(out.stats.decode_tokens_per_second, 1), "text": out.text[:60],
                  "anon_after_load": loaded["RssAnon"], "file_after_load": loaded["RssFile"],
                  "anon_after_generate": status()["RssAnon"], "file_after_generate": status()["RssFile"]}))
"""


def externalize(graph: Path, out: Path, align: int) -> None:
    """Write `graph` to `out` with every initializer of 1 KiB or more in out.data at offsets aligned to `align`."""
    import onnx

    model = onnx.load(str(graph), load_external_data=True)
    data_name = out.name + ".data"
    with open(out.parent / data_name, "wb") as f:
        for tensor in model.graph.initializer:
            if len(tensor.raw_data) < 1024:
                continue
            f.write(b"\0" * (-f.tell() % align))
            offset = f.tell()
            f.write(tensor.raw_data)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(f.tell() - offset))):
                tensor.external_data.add(key=key, value=value)
    onnx.save(model, str(out))


def variant(artifact: Path, folder: Path, align: int | None) -> Path:
    from jacobi_rt.runtime.file_digest import file_records

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    manifest = json.loads((artifact / "jacobi.json").read_text())
    graphs = set(manifest["graphs"].values())
    for name in manifest["files"]:
        if name in graphs and align is not None:
            externalize(artifact / name, folder / name, align)
        else:
            shutil.copyfile(artifact / name, folder / name)
    manifest["files"], manifest["samples"] = file_records(folder)
    (folder / "jacobi.json").write_text(json.dumps(manifest, indent=2))
    return folder


def run(folder: Path, entries: dict, tokens: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(folder), json.dumps(entries), str(tokens)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        return {"error": done.stderr[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--work", type=Path, required=True, help="scratch folder for the variants")
    parser.add_argument("--aligns", default="embedded,1,4096,65536")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--options", default=",".join(OPTIONS), help="which of " + ", ".join(OPTIONS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for align in args.aligns.split(","):
        folder = (
            args.artifact if align == "embedded" else variant(args.artifact, args.work / f"align-{align}", int(align))
        )
        for name in args.options.split(","):
            entries = OPTIONS[name]
            row = {"layout": align, "options": name, **run(folder, entries, args.tokens)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        if folder != args.artifact:
            shutil.rmtree(folder)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
