"""The package layering of ``../shared/design.md`` ("Layout"), read from the source with ``ast``.

Every import of every module is read: module-level, function-level, ``from . import x`` and
``from pkg import submodule``. The rules:

- which of our top-level packages each package may import (``MAY_IMPORT`` below);
- no package imports another package's private (``_name``) module or name;
- the run engine (``ENGINE``: execute, retry, providers, the limiter contract and the in-memory
  limiter, IR extraction, the local executor) reaches no Celery or Redis, not even through one
  of our modules it imports;
- no import cycle between our modules;
- each package's ``__init__`` declares ``__all__``, and every name in it exists.

The table is design.md's, plus the two top-level packages it places "beside" the others:

- ``simulator/`` is the stand-in model endpoint. It may import ``storage`` only: it reads the
  corpus format (``storage.annotations``, part of the data contract) to answer like a model that
  saw the prompt's annotations, and raises ``storage.errors.ConfigError`` for a bad config. It
  must not know the engine (workers) or the analysis it is measured by.
- ``orchestrator/`` may also import ``simulator``: ``irbench simulate`` and ``irbench demo``
  host the stand-in endpoint. Nothing below the orchestrator may. Likewise ``viewer``: the
  ``irbench view`` command (``orchestrator/cli/view.py``) hosts the web app.
- ``deploy/`` (local launchers: a cluster, a private redis-server, celery worker processes) is
  stdlib only, so it runs before anything is installed; tests and benchmarks use its launchers.
- ``bench/`` may import anything but ``tests``.

Inside ``orchestrator/`` the rooms form a DAG too (``ROOMS``): ``campaign`` (spec, plan, corpus,
retry selection) imports no other room; the two executors (``local``, ``distributed``) and the
``jobs`` build on it; ``cli`` sits on top and is the only room that may import ``simulator`` and
``viewer``. Type-only imports count as edges everywhere.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PACKAGES = ("storage", "workers", "orchestrator", "analysis", "viewer", "simulator", "bench", "deploy")
OURS = frozenset(PACKAGES) | {"tests"}

MAY_IMPORT: dict[str, frozenset[str]] = {
    "storage": frozenset(),
    "workers": frozenset({"storage"}),
    "orchestrator": frozenset({"workers", "storage", "analysis", "simulator", "viewer", "deploy"}),
    "analysis": frozenset({"storage"}),
    "viewer": frozenset({"storage", "analysis"}),
    "simulator": frozenset({"storage"}),
    "bench": frozenset(PACKAGES) - {"bench"},
    "deploy": frozenset(),
}

# The run engine: no Celery, no Redis, directly or through any module of ours it imports
# (including the package ``__init__`` files an import runs).
ENGINE = (
    "workers.execute",
    "workers.retry",
    "workers.ir_extract",
    "workers.gate",
    "workers.clock",
    "workers.errors",
    "workers.runtask",
    "workers.availability",
    "workers.providers",  # the package and every module under it
    "workers.limits",  # likewise (the Redis limiter lives in workers.celery)
    "orchestrator.local.executor",
)
ENGINE_FORBIDDEN = frozenset({"celery", "kombu", "redis"})

# orchestrator room -> the other orchestrator rooms it may import (and, for cli only, the hosts).
ROOMS: dict[str, frozenset[str]] = {
    "orchestrator.campaign": frozenset(),
    "orchestrator.local": frozenset({"orchestrator.campaign"}),
    "orchestrator.jobs": frozenset({"orchestrator.campaign", "orchestrator.local"}),
    "orchestrator.distributed": frozenset({"orchestrator.campaign", "orchestrator.local", "orchestrator.jobs"}),
    "orchestrator.cli": frozenset({"orchestrator.campaign", "orchestrator.local", "orchestrator.jobs",
                                   "orchestrator.distributed", "simulator", "viewer", "deploy"}),
}

@dataclass(frozen=True)
class Edge:
    importer: str  # dotted module name
    imported: str  # dotted module (or package) name, resolved against the repo
    names: tuple[str, ...]  # names taken with ``from x import a, b`` (empty for ``import x``)
    where: str  # path:line, for the failure message
    type_only: bool = False  # under ``if TYPE_CHECKING:``: a layering edge, not a runtime one

    @property
    def importer_top(self) -> str:
        return self.importer.split(".")[0]

    @property
    def imported_top(self) -> str:
        return self.imported.split(".")[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    base = REPO.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    parts = importer.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _type_checking_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    found.update(id(n) for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return found


def _edges_of(path: Path) -> list[Edge]:
    importer = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only = _type_checking_imports(tree)
    out: list[Edge] = []
    rel = path.relative_to(REPO)
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        t = id(node) in type_only
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append(Edge(importer, alias.name, (), where, t))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(importer, path.name == "__init__.py", node.level, node.module)
            else:
                base = node.module or ""
            names = tuple(a.name for a in node.names)
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when it is one.
            subs = [n for n in names if base.split(".")[0] in OURS and _is_module(f"{base}.{n}")]
            for n in subs:
                out.append(Edge(importer, f"{base}.{n}", (), where, t))
            rest = tuple(n for n in names if n not in subs)
            if rest or not subs:
                out.append(Edge(importer, base, rest, where, t))
    return out


def _all_edges() -> list[Edge]:
    edges: list[Edge] = []
    for pkg in PACKAGES:
        root = REPO / pkg
        if not root.is_dir():
            continue  # a package not in this tree has nothing to check
        for path in sorted(root.rglob("*.py")):
            if ".venv" in path.parts:
                continue
            edges.extend(_edges_of(path))
    return edges


EDGES = _all_edges()
OUR_EDGES = [e for e in EDGES if e.imported_top in OURS]


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def test_the_reader_sees_imports_of_every_kind() -> None:
    """Guard the reader itself: function-level, relative and ``from pkg import module`` imports."""
    by_importer = {(e.importer, e.imported) for e in EDGES}
    # function-level: orchestrator/cli/app.py imports the simulator inside the `simulate` command
    assert ("orchestrator.cli.app", "simulator.server") in by_importer
    # ``from workers.limits.base import ...`` at module level
    assert any(i == "workers.limits.memory" or i.startswith("workers.limits") for i, _ in by_importer)
    assert _resolve_relative("workers.limits.memory", False, 1, "base") == "workers.limits.base"
    assert _resolve_relative("workers.limits", True, 1, None) == "workers.limits"
    assert _resolve_relative("workers.limits.memory", False, 2, "errors") == "workers.errors"
    # ``if TYPE_CHECKING:`` imports are seen, and marked type-only
    assert any(e.importer == "workers.errors" and e.imported == "workers.limits.base" and e.type_only for e in EDGES)
    assert len(OUR_EDGES) > 200


def test_no_package_imports_what_the_layout_forbids() -> None:
    bad: list[str] = []
    for e in OUR_EDGES:
        src, dst = e.importer_top, e.imported_top
        if src == dst:
            continue
        if dst not in MAY_IMPORT[src]:
            bad.append(f"{e.where}: {e.importer} imports {e.imported} ({src} may import {sorted(MAY_IMPORT[src]) or 'nothing of ours'})")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "orchestrator" and len(parts) > 1 else parts[0]


def test_orchestrator_rooms_import_only_the_rooms_below_them() -> None:
    rooms = {p.parent.name for p in (REPO / "orchestrator").glob("*/__init__.py")}
    assert {f"orchestrator.{r}" for r in rooms} == set(ROOMS), "a new orchestrator room needs its row in ROOMS"
    flat = sorted(p.name for p in (REPO / "orchestrator").glob("*.py") if p.name != "__init__.py")
    assert not flat, f"orchestrator/ holds rooms only, not modules: {flat}"
    bad = []
    for e in OUR_EDGES:
        src = _room(e.importer)
        dst = _room(e.imported)
        if src not in ROOMS or src == dst or not (dst.startswith("orchestrator") or dst in ("simulator", "viewer", "deploy")):
            continue
        if dst not in ROOMS[src]:
            bad.append(f"{e.where}: {e.importer} imports {e.imported} ({src} may import {sorted(ROOMS[src]) or 'no other room'})")
    assert not bad, "orchestrator room violations:\n" + "\n".join(bad)


def test_the_room_check_can_fail() -> None:
    assert _room("orchestrator.local.executor") == "orchestrator.local"
    assert "viewer" not in ROOMS["orchestrator.jobs"] and "simulator" not in ROOMS["orchestrator.distributed"]


def test_no_package_reaches_into_another_packages_privates() -> None:
    bad = []
    for e in OUR_EDGES:
        if e.importer_top == e.imported_top:
            continue
        private_names = [n for n in e.names if n.startswith("_") and not n.startswith("__")]
        if _private(e.imported) or private_names:
            bad.append(f"{e.where}: {e.importer} imports {e.imported} {private_names or ''}".rstrip())
    assert not bad, "private imports across packages:\n" + "\n".join(bad)


def _graph(*, type_only: bool = False) -> dict[str, set[str]]:
    """Imports between our modules: runtime ones, plus ``if TYPE_CHECKING:`` ones when
    ``type_only`` (those load nothing, but a cycle through them is still a knot to untie)."""
    graph: dict[str, set[str]] = {}
    for e in OUR_EDGES:
        if e.imported != e.importer and (type_only or not e.type_only) and _is_module(e.imported):
            graph.setdefault(e.importer, set()).add(e.imported)
    return graph


def _with_parents(module: str) -> list[str]:
    """``module`` and the packages whose ``__init__`` importing it runs (``a``, ``a.b`` for ``a.b.c``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1) if _is_module(".".join(parts[:i]))]


def _closure(start: str, graph: dict[str, set[str]]) -> dict[str, str]:
    """Every module that importing ``start`` runs, mapped to the module that imports it (for paths)."""
    parent: dict[str, str] = {m: "" for m in _with_parents(start)}
    todo = list(parent)
    while todo:
        mod = todo.pop()
        for imported in graph.get(mod, ()):
            for nxt in _with_parents(imported):
                if nxt not in parent:
                    parent[nxt] = mod
                    todo.append(nxt)
    return parent


def test_the_run_engine_reaches_no_celery_or_redis() -> None:
    graph = _graph()
    modules = {_module_name(p) for pkg in ("workers", "orchestrator") for p in (REPO / pkg).rglob("*.py")}
    engine = sorted(m for m in modules if any(m == e or m.startswith(e + ".") for e in ENGINE))
    assert "workers.providers.openai_compat" in engine and "orchestrator.local.executor" in engine
    # the walk can fail: the Celery executor and the Celery task module do reach them
    for outside in ("orchestrator.distributed.executor", "workers.celery.tasks"):
        reached = {e.imported_top for m in _closure(outside, graph) for e in EDGES if e.importer == m and not e.type_only}
        assert {"celery", "redis"} <= reached, outside
    # importing a module runs its packages' __init__ files: they are walked too
    assert "workers.limits" in _closure("workers.limits.memory", graph)
    bad = []
    for start in engine:
        parent = _closure(start, graph)
        for mod in parent:
            for e in EDGES:
                if e.importer == mod and e.imported_top in ENGINE_FORBIDDEN and not e.type_only:
                    chain = [mod]
                    while parent[chain[-1]]:
                        chain.append(parent[chain[-1]])
                    bad.append(f"{start}: {' <- '.join(chain)} imports {e.imported} ({e.where})")
    assert not bad, "the run engine reaches Celery/Redis:\n" + "\n".join(sorted(set(bad)))


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.add(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert sorted(map(sorted, _cycles(graph))) == [["a", "b", "c"], ["e", "f"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """No cycle at all, type-only imports included, and no allow-list."""
    cycles = _cycles(_graph(type_only=True))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def _packages() -> list[str]:
    found = []
    for pkg in PACKAGES:
        root = REPO / pkg
        for init in sorted(root.rglob("__init__.py")) if root.is_dir() else ():
            found.append(_module_name(init))
    return found


@pytest.mark.parametrize("package", _packages())
def test_each_package_declares_its_public_names(package: str) -> None:
    init = REPO.joinpath(*package.split(".")) / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"))
    declared = [
        n
        for n in tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
    ]
    assert declared, f"{init.relative_to(REPO)} declares no __all__"
    mod = importlib.import_module(package)
    names = list(mod.__all__)
    assert len(names) == len(set(names)), f"{package}.__all__ repeats a name"
    missing = [n for n in names if not hasattr(mod, n) and not _is_module(f"{package}.{n}")]
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"
    # a package whose public names are (some of) its modules lists all its public modules
    root = REPO.joinpath(*package.split("."))
    public = {p.stem for p in root.glob("*.py") if not p.stem.startswith("_")}
    public |= {p.parent.name for p in root.glob("*/__init__.py") if not p.parent.name.startswith("_")}
    if public & set(names):
        unlisted = sorted(public - set(names))
        assert not unlisted, f"{package}.__all__ lists some of its modules but not {unlisted}"


def test_only_the_celery_side_imports_the_celery_adapter() -> None:
    """Inside ``workers``, ``workers.celery`` is a leaf: the engine never imports its adapter."""
    bad = [
        f"{e.where}: {e.importer} imports {e.imported}"
        for e in OUR_EDGES
        if e.imported.startswith("workers.celery") and e.importer_top == "workers" and not e.importer.startswith("workers.celery")
    ]
    assert not bad, "\n".join(bad)
