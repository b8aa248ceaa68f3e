"""The package's modules import one another without a circle: the import graph, built from every
module's source (ast; imports inside functions and under TYPE_CHECKING included, since a circle
there is one a reader must follow too), is acyclic. Packages: runtime, engines, exporter, server, tools, and the
measuring scripts of benchmarks/."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "engines", "exporter", "server", "tools", "benchmarks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports (`from .x import y` naming module x.y counts as x.y)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name.removeprefix("jacobi_rt.") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = (node.module or "").removeprefix("jacobi_rt.")
            targets = [source, *(f"{source}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):  # a package's own parent: its __init__
                found.add(target)
    return found


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_import_graph_finds_a_planted_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_the_package_is_in_an_import_circle():
    found = modules()
    graph = {name: imported(name, path, set(found)) for name, path in found.items()}
    assert graph["runtime.generator"] >= {"runtime.batcher", "runtime.request"}  # the graph sees relative imports
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_packages_import_one_another_one_way():
    """Folded to its packages (runtime, engines, exporter, server, tools, benchmarks), the graph has no circle either:
    the runtime reads what engines/ writes (runtime/backends/trt_plans.py) without importing it."""
    found = modules()
    folded: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for name, path in found.items():
        folded[name.split(".")[0]] |= {target.split(".")[0] for target in imported(name, path, set(found))}
    graph = {package: targets - {package} for package, targets in folded.items()}
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def runtime_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every import of the runtime in `path`, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jacobi_rt.runtime"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "*") for alias in node.names if alias.name.startswith("jacobi_rt.runtime")]
    return found


def test_the_server_uses_only_the_runtimes_public_names():
    """server/ is built on the runtime's public API (jacobi_rt.runtime.__all__), never on a module inside it, so
    the runtime's modules can be rearranged without touching the server."""
    public = set(ast.literal_eval(_all_of(REPO / "runtime" / "__init__.py")))
    used = [(path.name, *item) for path in sorted((REPO / "server").glob("*.py")) for item in runtime_imports(path)]
    assert used, "the server imports the runtime somewhere"
    inside = [(file, module, name) for file, module, name in used if module != "jacobi_rt.runtime"]
    assert not inside, f"server modules import the runtime's internals: {inside}"
    assert not [(file, name) for file, _, name in used if name not in public], "names outside runtime.__all__"


def _all_of(path: Path) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.unparse(node.value)
    raise AssertionError(f"{path} defines no __all__")
