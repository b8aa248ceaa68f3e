"""No runtime module over 400 lines (issue 36): one concept a module, read at once. A module that grows past it
is split by role (as runtime/slots.py and runtime/draft_length.py were), not squeezed."""

from __future__ import annotations

from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
MOST = 400


def test_no_runtime_module_is_over_400_lines():
    sizes = {str(p.relative_to(RUNTIME)): len(p.read_text().splitlines()) for p in sorted(RUNTIME.rglob("*.py"))}
    assert sizes and not {name: n for name, n in sizes.items() if n > MOST}
