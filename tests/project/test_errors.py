"""One exception tree: every error class irbench defines descends from ``IrbenchError``, and the
CLI turns any of them into one line and exit code 2."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from typer.testing import CliRunner

from analysis.errors import AnalysisError, ReportInputError
from orchestrator.cli.app import app
from storage.errors import ConfigError, IrbenchError, StorageError
from workers import errors as worker_errors

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("storage", "workers", "orchestrator", "analysis", "viewer", "simulator")
# Control-flow signals, not errors: they never reach a user. AioClient's two are aiohttp errors
# its connection protocol raises inside aiohttp; ``aio._translate`` turns them into the httpx
# exceptions ``_http.send`` classifies before anything leaves ``workers/providers/aio.py``.
SIGNALS = {"workers.celery.deferring.Deferred", "simulator.app._Reject",
           "workers.providers.aio._WriteStalled", "workers.providers.aio._BadFraming"}


def _exception_classes() -> list[str]:
    """Dotted names of every top-level class whose name says it is an exception."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")) if (REPO / pkg).is_dir() else ():
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.bases:
                    bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
                    if any(b.endswith(("Error", "Exception", "Exceeded", "Disabled", "Unavailable", "Closed")) for b in bases) or node.name.endswith("Error"):
                        found.append(".".join(parts) + "." + node.name)
    return found


def test_every_error_irbench_defines_is_under_the_root() -> None:
    names = _exception_classes()
    assert "workers.errors.WaitBudgetExceeded" in names and "analysis.errors.ReportInputError" in names
    outside = []
    for dotted in names:
        if dotted in SIGNALS:
            continue
        module, _, cls = dotted.rpartition(".")
        obj = getattr(importlib.import_module(module), cls)
        if isinstance(obj, type) and issubclass(obj, BaseException) and not issubclass(obj, IrbenchError):
            outside.append(dotted)
    assert not outside, f"exceptions outside the IrbenchError tree: {outside}"


def test_the_tree_has_one_class_per_name() -> None:
    # the names every layer may raise are the storage ones, re-exported, not copies
    assert worker_errors.ConfigError is ConfigError and worker_errors.StorageError is StorageError
    assert issubclass(ReportInputError, AnalysisError) and issubclass(AnalysisError, IrbenchError)
    for cls in (worker_errors.LimiterError, worker_errors.GateClosed, worker_errors.ProviderError):
        assert issubclass(cls, IrbenchError)
    from workers.errors import LimiterUnavailable, ModelDisabled, WaitBudgetExceeded

    assert LimiterUnavailable is worker_errors.LimiterUnavailable
    assert ModelDisabled is worker_errors.ModelDisabled and WaitBudgetExceeded is worker_errors.WaitBudgetExceeded


def test_an_analysis_input_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "analysis"
    empty.mkdir()
    r = CliRunner().invoke(app, ["report", "--data", str(tmp_path), "--analysis", str(empty), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output  # one line, however long
    assert "holds no panel outputs" in lines[0]
    assert not (tmp_path / "rep" / "report.html").exists()


def test_the_error_line_is_the_message_verbatim(capsys) -> None:
    import pytest
    import typer

    from orchestrator.cli.user_errors import fail

    message = "prompt p.txt line 3: [conditionRef=C1] names no id " + "x" * 300
    with pytest.raises(typer.Exit) as exit_info:
        fail(ConfigError(message))
    assert exit_info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err == f"error: {message}\n"  # markup-looking text kept, no wrapping


def _bare_value_errors(root: Path, base: Path = REPO) -> list[str]:
    """``raise ValueError(...)`` sites under ``root``, except inside pydantic validators (where
    ValueError is pydantic's protocol: it becomes a ValidationError naming the field)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        validators: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = {ast.unparse(d).split("(")[0].split(".")[-1] for d in fn.decorator_list}
                if names & {"field_validator", "model_validator", "validator", "root_validator"}:
                    validators.update(id(n) for n in ast.walk(fn))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and id(node) not in validators:
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id == "ValueError":
                    found.append(f"{path.relative_to(base)}:{node.lineno}")
    return found


def test_analysis_raises_analysis_errors_not_bare_value_errors() -> None:
    bad = _bare_value_errors(REPO / "analysis")
    assert not bad, "raise AnalysisError (analysis.errors) instead of ValueError at:\n" + "\n".join(bad)


def test_the_value_error_finder_finds_them(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from pydantic import field_validator\n"
        "def f(x):\n    raise ValueError('no')\n"
        "class M:\n    @field_validator('x')\n    def v(cls, x):\n        raise ValueError('pydantic')\n"
    )
    assert _bare_value_errors(pkg, base=tmp_path) == ["pkg/m.py:3"]
