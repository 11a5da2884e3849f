"""The viewer's Starlette application: read-only HTML pages and a JSON API over a RunIndex.

URLs (path segments are percent-encoded; a model name may contain "/", sent as %2F)::

    /                                         campaigns and panels
    /panels/{panel}                           leaderboard (analysis outputs) and run counts
    /models/{panel}/{model}                   one model's cells
    /cells/{campaign}/{model}/{prompt_sha256} one cell: runs, ?a=RUN&b=RUN side-by-side diff
    /runs/{run_id}                            one run: prompt, message sent, response, reasoning,
                                              IR nodes, attempts; ?wave_a=N&wave_b=M: the
                                              cell's runs of two waves side by side
    /text/{field}/{run_id}                    one stored text of a run, whole, as text/plain
                                              (field: prompt, message, response, reasoning)
    /runs?campaign=&model=&...&q=             filtered, searchable run list (paged)
    /health?by=model|date&...                 run health
    /report                                   the static report, when one is given
    /waves                                    campaigns and their measurement waves
    /waves/{campaign}?from=N&to=M             two waves compared per model (irbench waves)
    /api/runs?... /api/runs/{run_id} /api/cells/{campaign}/{model}/{prompt_sha256} /api/health
    /api/waves/{campaign}?from=N&to=M         that comparison as ``irbench waves --json`` prints it

Only GET/HEAD are routed: every other method is answered 405. Every response carries a
Content-Security-Policy that forbids scripts and any request off this origin, on top of the
templates' autoescaping of every stored string.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from itertools import combinations
from typing import Any
from urllib.parse import quote, unquote

from analysis.waves.compare import WaveComparison
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response,
)
from starlette.routing import Route

from storage.errors import ConfigError
from viewer.config import ViewerConfig
from viewer.diff import diff_runs, parse_nodes, parse_run, pretty_ir, text_diff
from viewer.grouping import group_runs
from viewer.index import RunIndex
from viewer.node_diff import node_diff
from viewer.query import QueryError, RunQuery
from viewer.render import CSP, SECURITY_HEADERS, jsonable, environment
from viewer.waves import WaveComparisons, WavesPage, cell_waves

def _segments(request: Request, prefix: str) -> list[str]:
    """Path segments after ``prefix``, each percent-decoded separately (so %2F stays inside
    its segment; the decoded ``path`` has lost that distinction)."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(request.url.path)
    path = path.split("?", 1)[0]
    if not path.startswith(prefix):
        raise HTTPException(404)
    return [unquote(s) for s in path[len(prefix):].split("/")]


def _cell_key(request: Request, prefix: str) -> tuple[str, str, str]:
    parts = _segments(request, prefix)
    if len(parts) < 3 or not all(parts):
        raise HTTPException(404, "a cell URL is /cells/{campaign}/{model}/{prompt_sha256}")
    return parts[0], "/".join(parts[1:-1]), parts[-1]


class _Timing(BaseHTTPMiddleware):
    """Adds ``Server-Timing: app;dur=<ms>`` and the security headers to every response."""

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.1f}"
        for key, value in SECURITY_HEADERS.items():  # a handler may set a stricter/other CSP
            response.headers.setdefault(key, value)
        return response


class Viewer:
    """Request handlers bound to one index and configuration."""

    def __init__(self, index: RunIndex, config: ViewerConfig) -> None:
        self.index = index
        self.config = config
        self.env = environment()
        self.waves = WaveComparisons(index, config.data_dir)

    # ------------------------------------------------------------------ helpers
    def page(self, template: str, **context: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(
            outputs=self.index.outputs, n_runs=self.index.n_runs,
            has_report=self.config.report_html is not None, **context)
        return HTMLResponse(html)

    def query(self, request: Request, ignore: tuple[str, ...] = ()) -> RunQuery:
        try:
            return RunQuery.from_params(request.query_params, default_limit=self.config.page_size,
                                        max_limit=self.config.max_page_size, ignore=ignore)
        except QueryError as exc:
            raise HTTPException(400, str(exc)) from None

    def clip(self, text: str | None, cap: int | None = None) -> tuple[str, bool]:
        """(the first ``cap`` characters, whether any were left out); cap: max_text_chars."""
        text = text or ""
        cap = cap or self.config.max_text_chars
        return (text[:cap], True) if len(text) > cap else (text, False)

    def asked(self, run: dict[str, Any]) -> dict[str, Any]:
        """What ``run`` was asked, as stored in ``prompts/``: the prompt text and the user
        message (None when not stored), each also clipped to ``max_prompt_chars`` for a page."""
        prompt = self.index.prompt_text(run["prompt_sha256"])
        message = self.index.user_message(run["prompt_sha256"], run["prompt_name"],
                                          run["instruction_sha256"])
        cap = self.config.max_prompt_chars
        return {"run_id": run["run_id"], "instruction_version": run["instruction_version"],
                "instruction_sha256": run["instruction_sha256"], "prompt_text": prompt,
                "user_message": message, "prompt": self.clip(prompt, cap),
                "message": self.clip(message, cap)}

    @staticmethod
    def _json_run(row: dict[str, Any]) -> dict[str, Any]:
        return jsonable(row)

    # ------------------------------------------------------------------ pages
    def home(self, request: Request) -> Response:
        return self.page("home.html", campaigns=self.index.campaigns(), spend=self.index.spend,
                         waves=self.index.waves,
                         panels=self.index.panels(), window=self.index.date_window())

    def panel(self, request: Request) -> Response:
        parts = _segments(request, "/panels/")
        panel = "/".join(parts)
        board = self.index.leaderboard(panel)
        counts = {r["model"]: r for r in self.index.panel_models(panel)}
        if not board and not counts:
            raise HTTPException(404, f"no panel {panel!r}")
        return self.page("panel.html", panel=panel, board=board, counts=counts,
                         excluded=self.index.excluded(panel),
                         manifest=self.index.outputs.manifests.get(panel, {}))

    def model(self, request: Request) -> Response:
        parts = _segments(request, "/models/")
        if len(parts) < 2:
            raise HTTPException(404)
        panel, model = parts[0], "/".join(parts[1:])
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            raise HTTPException(400, "bad query parameter 'offset': not an integer") from None
        limit = self.config.cells_page_size
        total = self.index.count_model_cells(panel, model)
        if not total:
            raise HTTPException(404, f"no runs of model {model!r} in panel {panel!r}")
        cells = self.index.model_cells(panel, model, limit, offset)
        board = [r for r in self.index.leaderboard(panel) if r["model"] == model]
        return self.page("model.html", panel=panel, model=model, cells=cells, total=total,
                         offset=offset, limit=limit, row=board[0] if board else None)

    def _cell(self, campaign: str, model: str, sha: str) -> tuple[int, list[dict[str, Any]]]:
        total, runs = self.index.cell_runs(campaign, model, sha, self.config.max_cell_runs)
        if not runs:
            raise HTTPException(404, f"no runs in cell {campaign}/{model}/{sha}")
        return total, runs

    def _wave_args(self, request: Request, *names: str) -> list[int | None]:
        out: list[int | None] = []
        for name in names:
            text = request.query_params.get(name) or None
            if text is not None and not text.isdigit():
                raise HTTPException(400, f"bad query parameter {name!r}: give a wave number")
            out.append(None if text is None else int(text))
        return out

    def cell(self, request: Request) -> Response:
        campaign, model, sha = _cell_key(request, "/cells/")
        total, runs = self._cell(campaign, model, sha)
        wave_a, wave_b = self._wave_args(request, "wave_a", "wave_b")
        try:
            waves = cell_waves(self.index, campaign, model, sha, self.config.max_cell_runs,
                               wave_a, wave_b)
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None
        by_id = {r["run_id"]: r for r in runs}
        for col in waves.columns if waves else ():  # a diff may pair runs of two waves
            for r in col.runs:
                by_id.setdefault(r["run_id"], r)
        ok = [r["run_id"] for r in runs if r["succeeded"]] or [r["run_id"] for r in runs]
        a_id = request.query_params.get("a") or ok[0]
        b_id = request.query_params.get("b") or (ok[1] if len(ok) > 1 else ok[0])
        for rid in (a_id, b_id):
            if rid not in by_id:
                raise HTTPException(400, f"run {rid!r} is not among this cell's shown runs")
        a, b = by_id[a_id], by_id[b_id]
        for r in (a, b):
            r["label"] = f"run {r['run_index']}" + (f" of wave {r['wave']}" if waves else "")
        diff = diff_runs(parse_run(a_id, a["ir_json"]), parse_run(b_id, b["ir_json"]))
        lines = self.config.max_diff_lines
        nodes = node_diff(a["ir_json"], b["ir_json"], max_rows=lines,
                          renames={r.before: r.after for r in diff.renamed})
        for r in runs:
            r["nodes"] = parse_nodes(r["ir_json"])
            r["response_shown"], r["response_clipped"] = self.clip(r["response_text"])
            r["reasoning_shown"], r["reasoning_clipped"] = self.clip(r["reasoning_text"])
        # one message per instruction the shown runs were sent (normally one)
        asked = [self.asked(r) for r in {(r["prompt_name"], r["instruction_sha256"]): r
                                         for r in runs}.values()]
        return self.page(
            "cell.html", campaign=campaign, model=model, sha=sha, runs=runs, total=total,
            groups=group_runs(runs), panel=runs[0]["panel"], prompt_name=runs[0]["prompt_name"],
            a=a, b=b, diff=diff, node_diff=nodes, asked=asked, waves=waves,
            cell=self.index.cell_metrics(runs[0]["panel"], campaign, model, sha),
            text_diff=text_diff(a["response_text"], b["response_text"], max_lines=lines),
            reasoning_diff=text_diff(a["reasoning_text"], b["reasoning_text"], max_lines=lines),
            ir_diff=None if nodes is not None else text_diff(
                pretty_ir(a["ir_json"]), pretty_ir(b["ir_json"]), max_lines=lines))

    def run(self, request: Request) -> Response:
        run_id = "/".join(_segments(request, "/runs/"))
        row = self.index.run(run_id)
        if row is None:
            raise HTTPException(404, f"no run {run_id!r}")
        row["response_shown"], row["response_clipped"] = self.clip(row["response_text"])
        row["reasoning_shown"], row["reasoning_clipped"] = self.clip(row["reasoning_text"])
        return self.page("run.html", run=row, nodes=parse_nodes(row["ir_json"]),
                         asked=self.asked(row))

    def text(self, request: Request) -> Response:
        """One stored text of a run, whole, as ``text/plain`` (the pages' "show all")."""
        parts = _segments(request, "/text/")
        if len(parts) < 2:
            raise HTTPException(404, "a text URL is /text/{prompt|message|response|reasoning}/{run_id}")
        field, run_id = parts[0], "/".join(parts[1:])
        if field not in ("prompt", "message", "response", "reasoning"):
            raise HTTPException(404, f"no text {field!r}: use prompt, message, response or reasoning")
        row = self.index.run(run_id)
        if row is None:
            raise HTTPException(404, f"no run {run_id!r}")
        if field in ("response", "reasoning"):
            body = row[f"{field}_text"]
        else:
            body = self.asked(row)["prompt_text" if field == "prompt" else "user_message"]
        if body is None:
            raise HTTPException(404, f"the store holds no {field} text for run {run_id!r}")
        return PlainTextResponse(body)

    def runs_page(self, request: Request) -> Response:
        query = self.query(request)
        found = self.index.runs(query, with_snippet=True)
        return self.page("runs.html", query=query, found=found,
                         campaigns=self.index.distinct("campaign"),
                         models=self.index.distinct("model"),
                         outcomes=self.index.distinct("outcome"))

    def health_page(self, request: Request) -> Response:
        by = request.query_params.get("by", "model")
        if by not in ("model", "date"):
            raise HTTPException(400, "by must be 'model' or 'date'")
        query = self.query(request, ignore=("by",))
        return self.page("health.html", by=by, query=query, rows=self.index.health(by, query),
                         campaigns=self.index.distinct("campaign"),
                         models=self.index.distinct("model"))

    def waves_index(self, request: Request) -> Response:
        return self.page("waves_index.html", waves=self.index.waves)

    def _waves_of(self, request: Request, prefix: str) -> WavesPage:
        campaign = "/".join(_segments(request, prefix))
        frm, to = self._wave_args(request, "from", "to")
        try:
            return self.waves.page(campaign, frm, to)
        except KeyError:
            raise HTTPException(404, f"no runs of campaign {campaign!r}") from None
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None

    def waves_page(self, request: Request) -> Response:
        return self.page("waves.html", w=self._waves_of(request, "/waves/"))

    def api_waves(self, request: Request) -> Response:
        """The chosen pair's comparison as ``irbench waves --campaign C --json`` prints it;
        409 with the one line when there is none (one wave, an unfinished wave)."""
        found = self._waves_of(request, "/api/waves/")
        chosen = found.chosen
        if chosen is None or chosen.comparison is None:
            line = (chosen.problem if chosen is not None and chosen.problem else
                    f"campaign {found.campaign!r} has one wave: measure another with irbench run "
                    "CAMPAIGN --new-wave")
            return JSONResponse({"error": line}, status_code=409)
        return Response(WaveComparison((chosen.comparison,)).to_json(),
                        media_type="application/json")

    # ------------------------------------------------------------------ API
    def api_runs(self, request: Request) -> Response:
        query = self.query(request)
        found = self.index.runs(query)
        return JSONResponse({"total": found.total, "limit": query.limit, "offset": query.offset,
                             "runs": [self._json_run(r) for r in found.runs]})

    def api_run(self, request: Request) -> Response:
        run_id = "/".join(_segments(request, "/api/runs/"))
        row = self.index.run(run_id)
        if row is None:
            raise HTTPException(404, f"no run {run_id!r}")
        asked = self.asked(row)  # null when the store has no prompts/ row for the run
        row["prompt_text"], row["user_message"] = asked["prompt_text"], asked["user_message"]
        return JSONResponse(self._json_run(row))

    def api_cell(self, request: Request) -> Response:
        campaign, model, sha = _cell_key(request, "/api/cells/")
        total, runs = self._cell(campaign, model, sha)
        parsed = [parse_run(r["run_id"], r["ir_json"]) for r in runs]
        paired = parsed[: self.config.max_pair_runs]
        return JSONResponse({
            "campaign": campaign, "model": model, "prompt_sha256": sha, "total_runs": total,
            "runs": [{"run_id": r["run_id"], "run_index": r["run_index"],
                      "budget_max_tokens": r["budget_max_tokens"], "outcome": r["outcome"],
                      "parse_outcome": r["parse_outcome"], "node_count": r["node_count"],
                      "node_ids": p.node_ids if p.nodes is not None else None}
                     for r, p in zip(runs, parsed, strict=True)],
            "pairs_over_runs": len(paired),
            "pairs": [diff_runs(x, y).to_json() for x, y in combinations(paired, 2)]})

    def report(self, request: Request) -> Response:
        """The static report (``irbench report``), served at ``/report`` so its relative
        leaderboard links (``models/...``) land on this viewer's pages. Its one inline script
        is allowed by hash, nothing else."""
        path = self.config.report_html
        if path is None or not path.is_file():
            raise HTTPException(404, "no report to serve: write one with `irbench report --out "
                                "DIR` and start the viewer with --report DIR")
        html = path.read_text(encoding="utf-8")
        nav = self.env.get_template("nav.html").render(
            outputs=self.index.outputs, n_runs=self.index.n_runs, has_report=True)
        html = _with_nav(html, nav)
        hashes = " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
            for body in re.findall(r"<script>(.*?)</script>", html, flags=re.S))
        csp = CSP.replace("default-src 'none';", f"default-src 'none'; script-src {hashes};"
                          if hashes else "default-src 'none';")
        return HTMLResponse(html, headers={"Content-Security-Policy": csp})

    def api_health(self, request: Request) -> Response:
        by = request.query_params.get("by", "model")
        if by not in ("model", "date"):
            raise HTTPException(400, "by must be 'model' or 'date'")
        rows = self.index.health(by, self.query(request, ignore=("by",)))
        return JSONResponse({"by": by, "groups": [self._json_run(r) for r in rows]})


def _with_nav(html: str, nav: str) -> str:
    """``html`` with the viewer's navigation ``nav`` as the first thing in its body."""
    m = re.search(r"<body\b[^>]*>", html, flags=re.I)
    return html[:m.end()] + nav + html[m.end():] if m else nav + html


def _error_handler(viewer: Viewer) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                                headers=headers)
        html = viewer.env.get_template("error.html").render(
            status=exc.status_code, detail=exc.detail, outputs=viewer.index.outputs,
            n_runs=viewer.index.n_runs)
        return HTMLResponse(html, status_code=exc.status_code, headers=headers)
    return handle


def create_app(index: RunIndex, config: ViewerConfig) -> Starlette:
    """The ASGI app over ``index`` (GET/HEAD only)."""
    v = Viewer(index, config)
    routes = [
        Route("/", v.home), Route("/runs", v.runs_page), Route("/health", v.health_page),
        Route("/panels/{rest:path}", v.panel), Route("/models/{rest:path}", v.model),
        Route("/cells/{rest:path}", v.cell), Route("/runs/{rest:path}", v.run),
        Route("/api/runs", v.api_runs), Route("/api/runs/{rest:path}", v.api_run),
        Route("/api/cells/{rest:path}", v.api_cell), Route("/api/health", v.api_health),
        Route("/text/{rest:path}", v.text),
        Route("/report", v.report), Route("/waves", v.waves_index),
        Route("/waves/{rest:path}", v.waves_page), Route("/api/waves/{rest:path}", v.api_waves),
        Route("/favicon.ico", lambda request: Response(status_code=204)),  # none, on purpose
        Route("/report/", lambda request: RedirectResponse("/report", status_code=301)),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Timing)],
                     exception_handlers={HTTPException: _error_handler(v)})
