"""Peak memory of an export, stage by stage: each step line with the wall time, RSS and peak RSS so far.

    python -m benchmarks.export_memory MODEL OUT [--quantize int4 | --weights gguf] [--no-stream]
        [--check layers] [--graphs-from DIR]

A thread samples the process's RSS every 50 ms (psutil), so a stage's transient peak shows.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time


def main() -> None:
    import psutil

    from jacobi_rt.exporter import ExportOptions, export

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--quantize", choices=["int8", "int4"])
    parser.add_argument("--weights", choices=["float", "gguf"], default="float")
    parser.add_argument("--no-stream", action="store_true")
    parser.add_argument("--check", choices=["auto", "full", "layers"], default="auto")
    parser.add_argument("--graphs-from")
    args = parser.parse_args()
    process, peak = psutil.Process(), [0]

    def watch() -> None:
        while True:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    started = time.time()

    def step(message: str) -> None:
        print(
            f"[{time.time() - started:6.1f}s rss {process.memory_info().rss / 2**20:7.0f} MB "
            f"peak {peak[0] / 2**20:7.0f} MB] {message}",
            flush=True,
        )

    export(
        args.model,
        args.out,
        ExportOptions(
            quantize=args.quantize,
            weights=args.weights,
            stream=not args.no_stream,
            check=args.check,
            graphs_from=args.graphs_from,
        ),
        overwrite=True,
        step=step,
    )
    print(
        f"total {time.time() - started:.1f} s, "
        f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )


if __name__ == "__main__":
    main()
