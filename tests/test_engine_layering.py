"""The run engine and the local executor import nothing of Celery or Redis (issue 9, req. 10).

Follows every import statement (module level and inside functions) from the starting modules
through our own packages, by parsing the source: a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OURS = ("storage", "workers", "orchestrator", "analysis", "simulator")
FORBIDDEN = ("celery", "kombu", "redis")
ENGINE = [
    "workers.execute", "workers.retry", "workers.ir_extract", "workers.gate", "workers.clock",
    "workers.errors", "workers.runtask", "workers.availability", "workers.limits",
    "workers.limits.base", "workers.limits.memory", "workers.providers",
    "workers.providers.base", "workers.providers.registry", "workers.providers.openai_compat",
    "workers.providers.ollama", "workers.providers._http",
]


def _path(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imports(module: str) -> set[str]:
    path = _path(module)
    assert path is not None, module
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # submodule imports
    return out


def reachable_foreign(start: str) -> dict[str, str]:
    """Forbidden top-level packages reachable from ``start``: package -> importing module."""
    seen: set[str] = set()
    todo = [start]
    found: dict[str, str] = {}
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        for name in _imports(mod):
            top = name.split(".")[0]
            if top in FORBIDDEN:
                found.setdefault(top, mod)
            elif top in OURS and _path(name) is not None:
                todo.append(name)
                parts = name.split(".")  # importing a.b.c also runs a/__init__ and a/b/__init__
                todo += [".".join(parts[:i]) for i in range(1, len(parts)) if _path(".".join(parts[:i]))]
    return found


def test_engine_and_local_executor_import_no_celery_or_redis() -> None:
    for start in ["orchestrator.local", *ENGINE]:
        assert reachable_foreign(start) == {}, f"{start} reaches {reachable_foreign(start)}"


def test_the_check_can_fail() -> None:
    # the distributed executor does reach them: the walker finds real imports
    assert set(reachable_foreign("orchestrator.celery_executor")) >= {"celery", "redis"}
    assert "redis" in reachable_foreign("workers.celery.tasks")


def test_workers_import_no_analysis_or_orchestrator() -> None:
    for path in sorted((REPO / "workers").rglob("*.py")):
        mod = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        bad = {n for n in _imports(mod) if n.split(".")[0] in ("analysis", "orchestrator", "simulator")}
        assert not bad, f"{mod} imports {sorted(bad)}"
