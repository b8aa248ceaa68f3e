"""Lines of `runtime/` at git revisions, split into code, docstrings, comments and blank lines.

Issue 22 set a line goal for the runtime ("all of today's work in fewer lines"); features added since
(structured output, the prefix cache, the batched draft) live in modules of their own plus hooks in
the shared ones. This tool prints each module's split per revision, and, with `--features`, the
lines outside those modules that name a feature (a lower bound on its hooks: a hook's body lines that
name nothing feature-specific are not counted), net of the lines that matched at the first revision.

    python -m benchmarks.runtime_lines 000231c^ HEAD --features
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from dataclasses import dataclass

# Features added after issue 22 was filed: their own modules, and what a line naming them matches.
FEATURES = {
    "structured output": ("runtime/constraints.py", r"matcher|constrain|Masks|masks|forced|grammar|allowed"),
    "prefix cache": (
        "runtime/prefix_cache.py",
        r"kept|KeptContexts|PrefixCache|prefix_cache|lone_cache|handover|adopt|"
        r"load_prefix|move_row|swap_rows|_parking|self\.cache|cached",
    ),
    "batched draft": ("runtime/draft_slots.py", r"DraftSlots|DraftRow|drafts|\.seat|sit\(|slots\.|row_of_its_own"),
}


@dataclass
class Split:
    total: int = 0
    code: int = 0
    docstring: int = 0
    comment: int = 0
    blank: int = 0

    def __add__(self, other: Split) -> Split:
        return Split(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))


def split(source: str) -> Split:
    """One file's lines by kind (a docstring: the first string of a module, class or function)."""
    lines = source.splitlines()
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, first.end_lineno + 1))
    blank = sum(1 for line in lines if not line.strip())
    comment = sum(1 for i, line in enumerate(lines, 1) if line.strip().startswith("#") and i not in docs)
    return Split(len(lines), len(lines) - blank - comment - len(docs), len(docs), comment, blank)


def sources(rev: str) -> dict[str, str]:
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "runtime"], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        name: subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True, check=True).stdout
        for name in names
        if name.endswith(".py")
    }


def hook_lines(files: dict[str, str], pattern: str) -> int:
    """Lines outside every feature's own module (counted whole already) that match `pattern`."""
    own = {module for module, _ in FEATURES.values()}
    return sum(
        1 for name, text in files.items() if name not in own for line in text.splitlines() if re.search(pattern, line)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help="git revisions to count (e.g. 000231c^ HEAD)")
    parser.add_argument("--features", action="store_true", help="also the later features' modules and hook lines")
    args = parser.parse_args()
    trees = {rev: sources(rev) for rev in args.revisions}
    names = sorted({name for files in trees.values() for name in files})
    print(f"{'module':34s}" + "".join(f"{rev:>20s}" for rev in args.revisions) + "   (total / code)")
    for name in names:
        cells = [split(files[name]) if name in files else None for files in trees.values()]
        print(f"{name:34s}" + "".join(f"{f'{c.total} / {c.code}' if c else '-':>20s}" for c in cells))
    totals = {rev: sum((split(text) for text in files.values()), Split()) for rev, files in trees.items()}
    for rev, total in totals.items():
        print(
            f"{rev}: {total.total} lines: {total.code} code, {total.docstring} docstring, {total.comment} comment, "
            f"{total.blank} blank"
        )
    if not args.features:
        return
    first = trees[args.revisions[0]]
    for rev, files in trees.items():
        rest = totals[rev]
        for feature, (own, pattern) in FEATURES.items():
            module = split(files[own]) if own in files else Split()
            hooks = hook_lines(files, pattern) - hook_lines(first, pattern)
            rest = Split(rest.total - module.total - hooks, rest.code - module.code)
            print(f"{rev}: {feature}: {module.total} lines in {own}, {hooks} hook lines elsewhere")
        print(
            f"{rev}: without them: {rest.total} lines ({rest.code} code lines outside the features' modules, "
            "hooks not taken out)"
        )


if __name__ == "__main__":
    main()
