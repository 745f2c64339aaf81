"""The import graph of mmproc/, service/ and benchmarks/ (read from the source, nothing imported): imports go
down only (benchmarks -> service -> mmproc; mmproc/bench included, so `mmproc bench` runs from a wheel), the
service proper never imports the client (the wire codec they share is mmproc/wire), and module-level imports form
no cycle (a function-level import is how a lazy dependency is written, and is left out of that)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mmproc", "service", "benchmarks")  # lowest layer first: a package imports only those before it
CLIENT_SIDE = ("service.app.cli",)
SERVICE_FLOORS = (
    "observe",
    "pipeline",
    "frontends",
    "app",
)  # service/'s folders, ground floor first  # `mmproc encode` is a client of the service


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level imports, all imports) of one file, as module names inside PACKAGES."""
    tree = ast.parse(path.read_text(), str(path))
    top, every = set(), set()
    in_function = {
        id(inner)
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(fn)
    }
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        names = [n for n in names if n.split(".")[0] in PACKAGES]
        every.update(names)
        if id(node) not in in_function:  # module level, `if TYPE_CHECKING:` and try included (a drawing counts them)
            top.update(names)
    return top, every


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "v1" not in p.parts}
    top, every = {}, {}
    for name, path in files.items():
        t, e = imports(path)
        top[name] = {m for m in t if m in files}  # `from x import name` also lists x.name: keep real modules
        every[name] = {m for m in e if m in files or m.rpartition(".")[0] in files}
    return top, every


def test_the_core_never_imports_the_service() -> None:
    _, every = graph()
    upward = {
        m: sorted(i for i in deps if i.startswith("service")) for m, deps in every.items() if m.startswith("mmproc")
    }
    assert not {m: d for m, d in upward.items() if d}


def test_imports_never_go_up_a_layer() -> None:
    _, every = graph()
    assert len(every) > 100 and any(m.startswith("benchmarks.") for m in every)  # all three packages were walked
    rank = {pkg: i for i, pkg in enumerate(PACKAGES)}
    upward = {m: sorted(i for i in deps if rank[i.split(".")[0]] > rank[m.split(".")[0]]) for m, deps in every.items()}
    assert not {m: d for m, d in upward.items() if d}


def test_the_service_never_imports_the_client() -> None:
    _, every = graph()
    clients = {
        m: sorted(i for i in deps if i.startswith("mmproc.client"))
        for m, deps in every.items()
        if m.startswith("service") and not m.startswith(CLIENT_SIDE)
    }
    assert not {m: d for m, d in clients.items() if d}


def test_module_level_imports_form_no_cycle() -> None:
    top, _ = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(top.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for module in sorted(top):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_service_folders_import_only_the_floors_below_them() -> None:
    """service/ in floors: app (composition, settings) -> frontends -> pipeline -> observe; settings are read in
    app/ only, and nothing imports a floor above its own, not even inside a function."""
    _, every = graph()
    floor = {name: i for i, name in enumerate(SERVICE_FLOORS)}
    modules = [m for m in every if m.startswith("service.")]
    assert {m.split(".")[1] for m in modules if m.count(".") > 1} == set(SERVICE_FLOORS)  # no folder outside a floor

    def floor_of(module: str) -> int:
        return floor[module.split(".")[1]]

    upward = {
        m: sorted(d for d in deps if d.startswith("service.") and d.count(".") > 1 and floor_of(d) > floor_of(m))
        for m, deps in every.items()
        if m.startswith("service.") and m.count(".") > 1
    }
    assert not {m: d for m, d in upward.items() if d}
