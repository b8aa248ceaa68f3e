"""No dead code at module level: every function, class and constant of the runtime and the server is
used by the project's own code, or is API for users (USER_API); tests alone keeping a name alive do
not count."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKED = ("runtime", "server")
EXPORTED = {"__all__", "__version__"}
USER_API = {
    "build",  # server/ray_app.py: Ray's application builder, `serve run jacobi_rt.server.ray_app:build`
    "BackgroundServer",  # server/run.py: the app on a loopback port in a thread, for embedding and tests
    "DEFAULT_JACOBI_TAIL",  # runtime/generator.py: generate()'s documented default for jacobi_tail
}


def sources() -> dict[Path, ast.Module]:
    names = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return {Path(name): ast.parse((REPO / name).read_text()) for name in names if not name.startswith("tests/")}


def defined(module: ast.Module) -> list[str]:
    names = []
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return [name for name in names if name not in EXPORTED]


def references(modules: dict[Path, ast.Module]) -> tuple[set[str], dict[str, set[str]]]:
    """(every attribute read anywhere, {module name: the names imported from it by name})."""
    attributes: set[str] = set()
    imported: dict[str, set[str]] = {}
    for module in modules.values():
        for node in ast.walk(module):
            if isinstance(node, ast.ImportFrom):
                imported.setdefault((node.module or "").split(".")[-1], set()).update(
                    alias.name for alias in node.names
                )
            elif isinstance(node, ast.Attribute):
                attributes.add(node.attr)
    return attributes, imported


def test_every_module_level_name_is_used_by_the_project():
    modules = sources()
    attributes, imported = references(modules)
    unused = []
    for path, module in modules.items():
        if path.parts[0] not in CHECKED or path.name == "__init__.py":
            continue
        read_here = {n.id for n in ast.walk(module) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        used = read_here | attributes | imported.get(path.stem, set()) | USER_API
        unused += [f"{path}: {name}" for name in defined(module) if name not in used]
    assert unused == []
