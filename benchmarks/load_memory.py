"""Load time and memory of an artifact with and without a mapped session (runtime/backends/ort_session.py).

    python -m benchmarks.load_memory build/smollm2-135m-int4 --tokens 16 --repeats 2

Each run is a fresh process: `Generator.load(ART)` and one greedy generation, reporting the load's wall
seconds, the peak RSS (VmHWM: a child's ru_maxrss would start from its parent's), the anonymous and
file-backed resident memory after loading and after generating, decode tokens/s and the tokens. Four
kinds of run, in this order each repeat:

- `artifact`: JACOBI_RT_CACHE=off (so `mapped=True` maps nothing and the exact-rows check runs, as at a first
  load on a CPU), the session made from the artifact's graph (prepacked in anonymous memory);
- `first`: an empty cache folder: the load makes the mapped session's entry (in a child process), then maps it;
- `mapped`: the same folder again: the entry is mapped;
- `default`: the same folder, `mapped=False`: what a user's second load gets (the artifact's session, the
  exact-rows verdict read back from the cache instead of checked again).

The exact-rows verdict lives in the same cache, so `first` and `mapped` differ by the entry alone.
The weights' size is the artifact's `.data` files; the entry's disk size is reported too.

`--pair` then loads two processes at once, as two server replicas on one host would, with and without
the mapped session, and reports their memory together: the sum of their Pss (each shared page counted
once in all) and of their Rss (/proc/PID/smaps_rollup, read while both hold the model).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = """
import json, sys, time
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "RssAnon", "RssFile")}
from jacobi_rt.runtime import Generator
start = time.perf_counter()
gen = Generator.load(sys.argv[1], threads=int(sys.argv[3]) or None, prefix_cache=False, mapped=sys.argv[4] == "1")
load = time.perf_counter() - start
loaded = status()
out = gen.generate("Write a story about a lighthouse keeper.", int(sys.argv[2]), strategy="greedy", chat=True)
done = status()
print(json.dumps({"load_s": round(load, 2), "peak": done["VmHWM"], "anon_loaded": loaded["RssAnon"],
                  "file_loaded": loaded["RssFile"], "anon": done["RssAnon"], "file": done["RssFile"],
                  "tokens_per_s": round(out.stats.decode_tokens_per_second, 2), "ids": out.ids,
                  "session": str(gen.backend.session_graph)}))
"""


_HOLD = (
    _RUN
    + """
sys.stdin.readline()  # hold the model until the parent has read our memory
"""
)


# smaps_rollup's fields, summed over the pair: Pss splits each shared page between its processes; anonymous pages
# are each process's own; clean file pages mapped by both count once in the page cache however Pss splits them
ROLLUP = {
    "pss": "Pss",
    "rss": "Rss",
    "anonymous": "Anonymous",
    "shared_clean": "Shared_Clean",
    "private_clean": "Private_Clean",
}


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes. AnonPages + Mapped counts each mapped file page once, whoever maps it: what two
    processes cost the host together, taken as its growth while they hold the model (other processes' churn
    included: run it on a quiet machine)."""
    fields = (line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return {key: int(value.split()[0]) * 1024 for key, value in fields}


def pair(artifact: str, cache: str, tokens: int, threads: int) -> dict:
    """Two processes holding the model at once: their summed smaps_rollup fields (ROLLUP), and the host's growth."""
    env = {**os.environ, "JACOBI_RT_CACHE": cache}
    before = meminfo()
    args = [sys.executable, "-c", _HOLD, artifact, str(tokens), str(threads), "1"]
    procs = [subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/")]
    procs[0].stdout.readline()  # the first makes the entry (if any) before the second loads
    procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/"))
    procs[1].stdout.readline()
    memory = dict.fromkeys(ROLLUP, 0)
    after = meminfo()
    memory["host"] = sum(after[k] - before[k] for k in ("AnonPages", "Mapped"))
    for proc in procs:
        rollup = dict(
            line.split(":", 1) for line in Path(f"/proc/{proc.pid}/smaps_rollup").read_text().splitlines()[1:]
        )
        for key, field in ROLLUP.items():
            memory[key] += int(rollup[field].split()[0]) * 1024
        proc.communicate("\n")
    return memory


def run(artifact: str, cache: str, tokens: int, threads: int, mapped: bool = True) -> dict:
    env = {**os.environ, "JACOBI_RT_CACHE": cache}
    done = subprocess.run(
        [sys.executable, "-c", _RUN, artifact, str(tokens), str(threads), str(int(mapped))],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def size(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens generated after loading")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: the physical cores)")
    parser.add_argument("--work", default=None, help="folder for the cache (default: a temporary one)")
    parser.add_argument("--pair", action="store_true", help="also measure two processes holding the model at once")
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    args.artifact = str(Path(args.artifact).resolve())  # the runs start in /
    weights = size(Path(args.artifact), "*.data")
    work = Path(args.work or tempfile.mkdtemp(prefix="load-memory-"))
    rows = []
    for repeat in range(args.repeats):
        cache = work / f"cache-{repeat}"
        shutil.rmtree(cache, ignore_errors=True)
        for kind, root in (("artifact", "off"), ("first", str(cache)), ("mapped", str(cache)), ("default", str(cache))):
            row = {
                "kind": kind,
                "repeat": repeat,
                **run(args.artifact, root, args.tokens, args.threads, kind != "default"),
            }
            row["entry_bytes"] = size(cache / "sessions", "*") if kind != "artifact" else 0
            rows.append(row)
            print(
                f"{kind:8s} load {row['load_s']:6.2f} s  peak {row['peak'] / weights:.2f}x "
                f"({row['peak'] / 1e9:.2f} GB)  anon/file after load {row['anon_loaded'] / 1e9:.2f}/"
                f"{row['file_loaded'] / 1e9:.2f} GB, after generating "
                f"{row['anon'] / 1e9:.2f}/{row['file'] / 1e9:.2f} GB"
                f"  {row['tokens_per_s']} tok/s  same tokens: {row['ids'] == rows[0]['ids']}",
                flush=True,
            )
    if rows:  # --repeats 0 --pair --work DIR: the pair alone, on DIR's cache-0 from an earlier run
        print(f"weights {weights / 1e9:.2f} GB; entry on disk {rows[-1]['entry_bytes'] / 1e9:.2f} GB")
    if args.pair:
        for kind, root in (("artifact", "off"), ("mapped", str(work / "cache-0"))):
            both = pair(args.artifact, root, args.tokens, args.threads)
            rows.append({"kind": f"pair-{kind}", **both})
            print(
                f"two processes, {kind:8s}: Pss {both['pss'] / 1e9:.2f} GB ({both['pss'] / weights:.2f}x the weights), "
                f"Rss {both['rss'] / 1e9:.2f} GB, anonymous {both['anonymous'] / 1e9:.2f} GB, clean file pages "
                f"shared {both['shared_clean'] / 1e9:.2f} / private {both['private_clean'] / 1e9:.2f} GB; "
                f"the host's AnonPages + Mapped grew {both['host'] / 1e9:.2f} GB",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"weights_bytes": weights, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
