"""Every `skulk` import obeys the package table in docs/ARCHITECTURE.md.

A package may import only the packages listed for it (imports under `if TYPE_CHECKING:`
do not count: they cost nothing at run time and cannot form a cycle). A new edge is a
design decision: add it here and to ARCHITECTURE.md's table in the same change.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "skulk"

SHARED = {"shared", "shared.types"}
ALLOWED: dict[str, set[str]] = {
    "shared.types": {"shared"},
    "shared": {"shared.types"},
    "routing": SHARED | {"datadir"},
    "datadir": SHARED,
    "models": SHARED | {"datadir"},
    "model_store": SHARED | {"datadir", "models"},
    "artifacts": SHARED | {"models"},
    "facts": SHARED | {"datadir", "routing", "provision", "dashboard", "extensions"},
    "capacity": SHARED,
    "service": SHARED,
    "provision": SHARED,
    "observe": SHARED | {"datadir"},
    "cluster": SHARED | {"routing", "facts"},
    "master": SHARED | {"capacity", "cluster", "routing", "datadir"},
    "pool": SHARED,
    "worker.engines": SHARED | {"facts", "pool", "provision"},
    "worker": SHARED | {"cluster", "routing", "observe", "models", "model_store", "artifacts", "worker.engines"},
    "api.adapters": SHARED | {"api"},
    "api.realtime": SHARED,
    "api.speech_providers": SHARED | {"api", "api.realtime", "api.routes", "extensions"},
    "api": SHARED | {"datadir", "observe", "models", "api.routes", "extensions"},
    "api.routes": SHARED | {"api", "api.adapters", "api.realtime", "observe", "master", "models", "model_store",
                            "dashboard", "datadir", "extensions"},
    "client": {"api", "shared"},
    "node_settings": SHARED | {"datadir", "facts"},
    "dashboard": {"shared"},
    "extensions": SHARED,
}
"""Package -> the packages it may import. `node`, `cli`, `cli_engines`, `cli_service` and `__main__` are
the composition roots and may import anything."""

ROOTS = {"node", "cli", "cli_engines", "cli_service", "__main__"}


def package_of(module: str) -> str:
    parts = module.split(".")[1:]  # drop "skulk"
    if not parts:
        return ""
    if parts[0] == "worker" and parts[1:2] == ["engines"]:
        return "worker.engines"
    if parts[0] == "api" and len(parts) > 1 and parts[1] in ("adapters", "routes", "realtime", "speech_providers"):
        return f"api.{parts[1]}"
    if parts[0] == "shared" and parts[1:2] == ["types"]:
        return "shared.types"
    return parts[0]


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every skulk import outside `if TYPE_CHECKING:` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("skulk") and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("skulk"))
    return found


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_every_package_is_in_the_table() -> None:
    packages = {package_of("skulk." + ".".join(p.relative_to(SRC).with_suffix("").parts)) for p in _modules()}
    unknown = {p for p in packages if p not in ALLOWED and p not in ROOTS and p != "__init__"}
    assert not unknown, f"packages missing from the ARCHITECTURE.md table and ALLOWED: {sorted(unknown)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_follow_the_table(path: Path) -> None:
    source = package_of("skulk." + ".".join(path.relative_to(SRC).with_suffix("").parts))
    if source in ROOTS or source == "__init__":
        return
    allowed = ALLOWED[source] | {source}
    bad = [
        f"line {line}: {module} ({package_of(module)})"
        for line, module in _runtime_imports(ast.parse(path.read_text(encoding="utf-8")))
        if package_of(module) not in allowed and package_of(module) != ""
    ]
    assert not bad, f"{source} may not import these (docs/ARCHITECTURE.md): {bad}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(("skulk", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _top_level_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The skulk modules a module imports when it is imported: its top-level imports,
    those under `if TYPE_CHECKING:` included (a type checker follows them too); imports
    inside functions are lazy and left out. `from skulk.a import b` names the module
    `skulk.a.b` when there is one, else `skulk.a`."""
    statements: list[ast.stmt] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.If, ast.Try)):
            pending.extend(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])
        else:
            statements.append(node)
    found: set[str] = set()
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("skulk") and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("skulk"))
    return found & known


def test_the_module_import_graph_has_no_circle() -> None:
    """No module imports itself back through others, at module level. A circle makes import
    order matter and hides which module is the lower one; break it by moving the shared
    part down (as `api/context.py` and `node_settings.py` were)."""
    paths = {_module_name(p): p for p in _modules()}
    known = set(paths)
    graph = {m: _top_level_imports(ast.parse(p.read_text(encoding="utf-8")), known) - {m} for m, p in paths.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)
