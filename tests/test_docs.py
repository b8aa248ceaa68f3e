"""The docs stand on their own and say what the code has: no pointers outside the repository, counts
that match their lists, and the layout table naming every runtime module."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def tracked(*patterns: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / name for name in names]


def test_no_doc_or_comment_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared/(design|facts|style)\.md|\bfacts\.md\b|\bdesign\.md\b")
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in tracked("*.md", "*.py", "*.sh", "*.toml") if path.is_file()
                 for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert offenders == []


def count_after(text: str, sentence: re.Pattern, item: re.Pattern) -> tuple[int, int]:
    """(the number the sentence announces, the items of the list that follows it)."""
    match = sentence.search(text)
    assert match, sentence.pattern
    items = 0
    for line in text[match.end():].splitlines()[1:]:
        if item.match(line):
            items += 1
        elif line and not line.startswith(" "):
            break
    return WORDS[match.group(1)], items


def test_the_readme_announces_as_many_parts_as_it_lists():
    announced, listed = count_after((REPO / "README.md").read_text(), re.compile(r"jacobi-rt has (\w+) parts:"), re.compile(r"- "))
    assert announced == listed


def test_the_backend_docstring_announces_as_many_calls_as_it_shows():
    text = (REPO / "runtime" / "backends" / "base.py").read_text()
    announced, listed = count_after(text, re.compile(r"drives a context with (\w+) calls:"), re.compile(r"    (out = )?ctx\.\w+\("))
    assert announced == listed


def test_the_layout_table_names_every_runtime_module():
    row = next(line for line in (REPO / "docs" / "architecture.md").read_text().splitlines() if line.startswith("| `runtime/`"))
    modules = [p.stem for p in (REPO / "runtime").glob("*.py") if p.stem != "__init__"]
    assert [m for m in modules if f"`{m}`" not in row] == []


def test_architecture_counts_the_backend_calls_the_docstring_shows():
    base = (REPO / "runtime" / "backends" / "base.py").read_text()
    design = (REPO / "docs" / "architecture.md").read_text()
    in_base = re.search(r"drives a context with (\w+) calls:", base).group(1)
    in_design = re.search(r"`BackendContext` [^.]*?with (\w+) calls", design).group(1)
    assert in_design == in_base


# Sentences that said every output is greedy's, or that a supported field is refused, after sampling
# and repetition_penalty arrived (issue 25); the code says otherwise.
STALE = ["temperature must be 0 or left out", "Every strategy gives greedy's output", "token-identical to greedy, without",
         "Jacobi decoding, token-identical to greedy.", "equals greedy decoding token for token",
         "The result equals greedy decoding token for token", "the target's greedy decoding whatever",
         "The output is greedy's either way", "do not declare (repetition_penalty", "Nothing else times the target"]


def test_no_stale_greedy_only_or_refused_field_claims():
    offenders = [f"{path.relative_to(REPO)}: {phrase}" for path in tracked("*.md", "*.py") if path.is_file()
                 and path.name != "test_docs.py" for phrase in STALE if phrase in " ".join(path.read_text().split())]
    assert offenders == []
