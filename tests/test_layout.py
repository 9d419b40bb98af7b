"""The layout's rules (README, Layout), checked on the source: imports follow the data flow (no module
imports one of a later stage), no import by string outside cli.py, every module under 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "leaktrace"
# Stages, lowest first; a module may import its own stage and those below.
STAGES: list[tuple[str, ...]] = [
    ("errors", "atomic", "cachedir", "slope", "resources", "redact", "memclass", "elf", "dwarf", "pyframes", "tracefs", "__init__"),
    ("procfs", "procmem", "outdir", "targetlock", "sched"),
    ("vllm", "session"),
    ("probes",),
    ("analysis",),
    ("report",),
    ("hunt", "live", "demo", "huntspec", "ticking"),
    ("cluster",),
    ("watch",),  # the always-on conductor: it runs hunts and selects targets as cluster hunts do
    ("commands", "cli", "doctor", "__main__"),
]
RANK = {name: i for i, names in enumerate(STAGES) for name in names}


def _modules() -> list[tuple[str, Path]]:
    return [(".".join(p.relative_to(PKG.parent).with_suffix("").parts), p) for p in sorted(PKG.rglob("*.py"))]


def _rank(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return RANK.get(top, RANK["__init__"]) if top.startswith("__") else RANK[top]  # __version__: the package


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("leaktrace"):
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if node.module == "leaktrace"]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("leaktrace")]
    return [m for m in out if m != "leaktrace"]


def test_every_module_has_a_stage():
    assert not [m for m, _ in _modules() if (m.split(".") + ["__init__"])[1] not in RANK]


def test_imports_follow_the_data_flow():
    upward = [f"{m} (stage {_rank(m)}) imports {imp} (stage {_rank(imp)})"
              for m, p in _modules() for imp in _imports(p) if _rank(imp) > _rank(m)]
    assert upward == []


def test_no_import_by_string_outside_cli():
    found = []
    for m, p in _modules():
        if m == "leaktrace.cli":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("import_module", "__import__"):
                    found.append(f"{m}:{node.lineno}")
    assert found == []


def test_every_module_under_400_lines():
    assert [f"{m}: {n}" for m, p in _modules() if (n := len(p.read_text().splitlines())) >= 400] == []


def _runtime_imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The leaktrace modules ``module`` imports when it runs (function-level imports included; those under
    ``if TYPE_CHECKING:`` never run), each resolved to the module it names (``from a.b import c``: ``a.b.c``
    when that is a module, else ``a.b``)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            if base.startswith("leaktrace"):
                found |= {resolve(f"{base}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("leaktrace")}
    return {m for m in found if m and m != module}


def test_no_import_cycle():
    """No module imports itself back through others: each cycle found is listed, its modules in order."""
    paths = {m.removesuffix(".__init__"): p for m, p in _modules()}
    graph = {m: _runtime_imports(m, p, set(paths)) for m, p in paths.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []
