"""PNG plots for `jacobi-rt bench` (matplotlib, imported here only): tokens/s by configuration,
tokens per pass by prompt category, and the tokens accepted per decoding pass."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

MATPLOTLIB_HINT = "matplotlib is not installed (pip install matplotlib, or the [bench] extra)"


def available() -> str | None:
    """None when plots can be drawn, else the reason they cannot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return MATPLOTLIB_HINT
    return None


def plot_all(records: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(r["config"] for r in records))
    paths = []

    # tokens/s by configuration: a box per configuration (median line, p25-p75 box)
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(names) + 2), 3.6), dpi=80)
    ax.boxplot([[r["decode_tokens_per_second"] for r in records if r["config"] == n] for n in names], showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("tokens/s by configuration (box: p25-p75)")
    paths.append(_save(fig, out / "tokens_per_second.png"))

    # tokens per pass by prompt category (configurations that report passes)
    categories = list(dict.fromkeys(r["category"] for r in records))
    with_passes = [n for n in names if any(r["config"] == n and r["tokens_per_pass"] for r in records)]
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(categories) + 2), 3.6), dpi=80)
    width = 0.8 / max(len(with_passes), 1)
    for k, name in enumerate(with_passes):
        values = []
        for c in categories:
            xs = sorted(
                r["tokens_per_pass"]
                for r in records
                if r["config"] == name and r["category"] == c and r["tokens_per_pass"]
            )
            values.append(xs[len(xs) // 2] if xs else 0)
        ax.bar([i + k * width for i in range(len(categories))], values, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(categories))], categories, rotation=30, ha="right")
    ax.set_ylabel("tokens per target pass (median)")
    ax.legend(fontsize=7)
    ax.set_title("tokens per pass by prompt category")
    paths.append(_save(fig, out / "tokens_per_pass_by_category.png"))

    # accepted tokens per decoding pass (jacobi-rt configurations, from the recorded commits)
    counted = {
        n: Counter(a for r in records if r["config"] == n for a in (r["accepted_per_pass"] or [])) for n in names
    }
    counted = {n: c for n, c in counted.items() if c and n != "greedy"}
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=80)
    top = max((max(c) for c in counted.values()), default=1)
    width = 0.8 / max(len(counted), 1)
    for k, (name, c) in enumerate(counted.items()):
        total = sum(c.values())
        ax.bar([a + k * width for a in range(1, top + 1)], [c[a] / total for a in range(1, top + 1)], width, label=name)
    ax.set_xlabel("tokens committed by one pass")
    ax.set_ylabel("share of passes")
    ax.legend(fontsize=7)
    ax.set_title("tokens accepted per decoding pass")
    paths.append(_save(fig, out / "accepted_per_pass.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
