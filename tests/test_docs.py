"""The docs stand on their own and say what the code has: every `jacobi-rt ...` command and flag in
README.md and docs/ is one the CLI takes, the README's Python compiles, every linked file exists;
no pointers outside the repository, counts that match their lists, the layout table naming every
runtime and exporter module."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def tracked(*patterns: str) -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in names]


def test_no_doc_or_comment_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared/(design|facts|style)\.md|\bfacts\.md\b|\bdesign\.md\b")
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in tracked("*.md", "*.py", "*.sh", "*.toml")
        if path.is_file()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert offenders == []


def count_after(text: str, sentence: re.Pattern, item: re.Pattern) -> tuple[int, int]:
    """(the number the sentence announces, the items of the list that follows it)."""
    match = sentence.search(text)
    assert match, sentence.pattern
    items = 0
    for line in text[match.end() :].splitlines()[1:]:
        if item.match(line):
            items += 1
        elif line and not line.startswith(" "):
            break
    return WORDS[match.group(1)], items


def test_the_readme_announces_as_many_parts_as_it_lists():
    announced, listed = count_after(
        (REPO / "README.md").read_text(), re.compile(r"jacobi-rt has (\w+) parts:"), re.compile(r"- ")
    )
    assert announced == listed


def test_the_backend_docstring_announces_as_many_calls_as_it_shows():
    text = (REPO / "runtime" / "backends" / "base.py").read_text()
    announced, listed = count_after(
        text, re.compile(r"drives a context with (\w+) calls:"), re.compile(r"    (out = )?ctx\.\w+\(")
    )
    assert announced == listed


def test_the_layout_table_names_every_runtime_module():
    row = next(
        line for line in (REPO / "docs" / "architecture.md").read_text().splitlines() if line.startswith("| `runtime/`")
    )
    modules = [p.stem for p in (REPO / "runtime").glob("*.py") if p.stem != "__init__"]
    assert [m for m in modules if f"`{m}`" not in row] == []


def test_the_layout_table_names_every_exporter_module_in_its_subpackage():
    row = next(
        line
        for line in (REPO / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("| `exporter/`")
    )
    exporter = REPO / "exporter"
    modules = [p.relative_to(exporter) for p in exporter.rglob("*.py") if p.stem != "__init__"]
    assert [str(m) for m in modules if f"`{m.stem}`" not in row] == []
    assert [p.name for p in exporter.iterdir() if (p / "__init__.py").is_file() and f"`{p.name}/`" not in row] == []


def test_architecture_counts_the_backend_calls_the_docstring_shows():
    base = (REPO / "runtime" / "backends" / "base.py").read_text()
    design = (REPO / "docs" / "architecture.md").read_text()
    in_base = re.search(r"drives a context with (\w+) calls:", base).group(1)
    in_design = re.search(r"`BackendContext` [^.]*?with (\w+) calls", design).group(1)
    assert in_design == in_base


# Sentences that said every output is greedy's, or that a supported field is refused, after sampling
# and repetition_penalty arrived (issue 25); the code says otherwise.
STALE = [
    "temperature must be 0 or left out",
    "Every strategy gives greedy's output",
    "token-identical to greedy, without",
    "Jacobi decoding, token-identical to greedy.",
    "equals greedy decoding token for token",
    "The result equals greedy decoding token for token",
    "the target's greedy decoding whatever",
    "The output is greedy's either way",
    "do not declare (repetition_penalty",
    "Nothing else times the target",
]


def test_no_stale_greedy_only_or_refused_field_claims():
    offenders = [
        f"{path.relative_to(REPO)}: {phrase}"
        for path in tracked("*.md", "*.py")
        if path.is_file() and path.name != "test_docs.py"
        for phrase in STALE
        if phrase in " ".join(path.read_text().split())
    ]
    assert offenders == []


def commands(text: str) -> list[str]:
    """Every `jacobi-rt ...` command: lines of shell blocks (continuations joined, comments cut) and
    inline code spans."""
    found = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("jacobi-rt "):
                found.append(line.strip().split(" #", 1)[0])
    prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
    return found + re.findall(r"`(jacobi-rt [^`]+)`", prose)


def options(command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help", "-h"}


def unknown_flags(line: str) -> list[str]:
    """The flags of `line` that its jacobi-rt command does not take (a placeholder such as -n N is fine)."""
    from jacobi_rt.tools.cli.main import cli

    try:
        words = shlex.split(line)
    except ValueError:  # an inline span may cut a quoted value short
        words = line.split()
    if len(words) < 2 or words[1].startswith("-"):
        command, given = cli, words[1:]
    elif words[1] not in cli.commands:
        return [f"no command {words[1]!r}"]
    else:
        command, given = cli.commands[words[1]], words[2:]
    flags = [w.split("=", 1)[0] for w in given if re.match(r"--?[a-zA-Z]", w)]
    return [flag for flag in flags if flag not in options(command)]


def test_every_jacobi_rt_command_in_the_docs_is_one_the_cli_takes():
    pytest.importorskip("click", reason="the CLI needs click (a core dependency): pip install '.[cpu]'")
    wrong = [
        f"{path.relative_to(REPO)}: {line!r}: {flags}"
        for path in docs()
        for line in commands(path.read_text())
        if (flags := unknown_flags(line))
    ]
    assert commands((REPO / "README.md").read_text()), "the README shows no jacobi-rt command"
    assert wrong == []


GUIDES = ("README.md", "docs/serve.md")  # user's guides: a `--flag` in their prose is a jacobi-rt option


@pytest.mark.parametrize("guide", GUIDES)
def test_every_flag_a_guide_names_is_a_cli_option(guide):
    """`--max-body` is a serve option; the README once called it `--max-body-bytes`."""
    from jacobi_rt.tools.cli.main import cli

    every = set().union(*(options(command) for command in cli.commands.values()))
    prose = re.sub(r"```.*?```", "", (REPO / guide).read_text(), flags=re.S).replace("\n", " ")
    named = [flag for span in re.findall(r"`(--[^`]+)`", prose) for flag in re.findall(r"--[\w-]+", span)]
    assert named and sorted({flag for flag in named if flag not in every}) == []


def test_the_readmes_python_compiles():
    snippets = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert snippets
    for snippet in snippets:
        compile(snippet, "README.md", "exec")


def test_every_linked_file_exists():
    missing = []
    for path in docs() + [REPO / "CHANGELOG.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                if not (path.parent / target.split("#", 1)[0]).exists():
                    missing.append(f"{path.relative_to(REPO)} -> {target}")
    assert missing == []


def test_the_readme_is_a_guide_and_the_measurements_are_dated():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for heading in ("## The two commands", "## What has run where", "## Exact on every CPU"):
        assert heading in readme
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    bench = sorted((REPO / "docs" / "bench").glob("*.md"))
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md|README\.md", p.name) for p in bench), bench
    index = (REPO / "docs" / "bench" / "README.md").read_text()
    assert [p.name for p in bench if p.name != "README.md" and p.name not in index] == []
