"""The dated report (analysis/report*.py): built from analysis outputs on disk, never recomputed.

Synthetic analysis directories are written directly with pyarrow in the layout and column names
of ``irbench analyze``, so the report is tested with every section present, with only
the files the current analysis writes, and at 100 models × 1,000 prompts. One test runs the real
``run_analysis`` on a real RunStore and then the ``report_command`` through typer.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis.report.build import ReportInputError, build_report
from analysis.report.sections import ReportOptions

from tests.support.report_inputs import (
    FIXED_NOW,
    PNG_MAGIC,
    SECTION_IDS,
    parse,
    write_availability,
    write_synthetic_analysis,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("full")
    out, data = root / "out", root / "data"
    write_synthetic_analysis(out, small_models=2)
    write_availability(data, [("model-000", dt.date(2026, 6, 1), "available"),
                              ("model-000", dt.date(2026, 6, 20), "retired"),
                              ("model-000", dt.date(2026, 6, 21), "retired"),
                              ("model-001", dt.date(2026, 6, 1), "available"),
                              ("model-001", dt.date(2026, 6, 21), "available")])
    paths = build_report(out, root / "report", data_dir=data, now=lambda: FIXED_NOW)
    return out / "synth", root / "report", paths.html.read_text(encoding="utf-8")


# ------------------------------------------------------------------ tests

def test_sections_in_issue_order_with_dated_title(full_report) -> None:
    _, _, html = full_report
    ids = re.findall(r'<section id="([a-z]+)">', html)
    assert ids == SECTION_IDS
    p = parse(html)
    assert [h.split(". ", 1)[1] for h in p.h2] == [
        "Headline partition", "Leaderboard", "Plots", "Sensitivity", "Pairs",
        "Correctness versus stability", "Availability", "Run health", "Provenance"]
    title = re.search(r"<h1>(.*?)</h1>", html).group(1)
    assert "2026-05-30 to 2026-06-11" in title and "reported 2026-07-01" in title
    # the partition comes before any sorted table
    assert html.index('id="partition-synth"') < html.index('id="leaderboard-synth"')
    assert "not available" not in html.split('<section id="availability">')[0]


def test_leaderboard_cells_match_models_parquet(full_report) -> None:
    pdir, _, html = full_report
    models = pq.read_table(pdir / "models.parquet").to_pylist()
    table = parse(html).tables["leaderboard-synth"]
    head = table["head"]
    assert head[:4] == ["rank", "model", "n", "mean Jaccard"]
    assert len(table["rows"]) == len(models)
    col = {name: i for i, name in enumerate(head)}
    for row, ref in zip(table["rows"], models, strict=True):
        assert row[col["model"]][0] == ref["model"]
        assert int(row[col["rank"]][0]) == ref["rank"]
        assert int(row[col["n"]][0]) == ref["n_prompts"]
        text, sort = row[col["mean Jaccard"]]
        assert text == f"{ref['mean_jaccard']:.3f}" and float(sort) == ref["mean_jaccard"]
        assert row[col["ID-stability"]][0] == f"{ref['id_stability']:.3f}"
        assert row[col["Jaccard 95% CI"]][0] == (
            f"[{ref['jaccard_ci_low']:.3f}, {ref['jaccard_ci_high']:.3f}]")
        assert row[col["ID 95% CI"]][0] == f"[{ref['id_ci_low']:.3f}, {ref['id_ci_high']:.3f}]"
        assert row[col["node-set-perfect"]][0] == f"{ref['perfect']}/{ref['n_cells']}"
        assert float(row[col["rank held"]][1]) == ref["rank_held"]
        lo, hi = ref["rank_set_low"], ref["rank_set_high"]
        assert row[col["rank set"]][0] == (str(lo) if lo == hi else f"{lo}–{hi}")


def test_small_n_models_are_flagged(full_report) -> None:
    pdir, _, html = full_report
    models = pq.read_table(pdir / "models.parquet").to_pylist()
    small = {r["model"] for r in models if r["n_prompts"] < 8}
    assert len(small) == 2
    table = parse(html).tables["leaderboard-synth"]
    col = table["head"].index("warning")
    flagged = {row[1][0] for row, cls in zip(table["rows"], table["classes"], strict=True)
               if row[col][0] == "n < 8" and cls == "hl"}
    assert flagged == small
    assert "small n: 2 model(s) rest on fewer than 8 prompts" in html


def test_under_covering_intervals_are_flagged(full_report) -> None:
    pdir, _, html = full_report
    models = pq.read_table(pdir / "models.parquet").to_pylist()
    low = {r["model"] for r in models if r["jaccard_ci_coverage"] < 0.93}
    assert len(low) == 1
    table = parse(html).tables["leaderboard-synth"]
    cov, warn = table["head"].index("CI coverage"), table["head"].index("warning")
    for row, cls, ref in zip(table["rows"], table["classes"], models, strict=True):
        flagged = ref["model"] in low
        assert row[cov][0] == f"{ref['jaccard_ci_coverage']:.2f}" + (" (low)" if flagged else "")
        assert ("interval covers 0.91 in simulation" in row[warn][0]) == flagged
        if flagged:
            assert cls == "hl"


def test_every_image_is_an_embedded_png_and_no_external_assets(full_report) -> None:
    _, _, html = full_report
    p = parse(html)
    assert len(p.images) == 6  # forest, ranks, heatmap, drift, stabilisation, availability
    for src in p.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<link" not in html and html.count("<script>") == 1


def test_partition_lists_every_model_once_by_label(full_report) -> None:
    pdir, _, html = full_report
    models = pq.read_table(pdir / "models.parquet").to_pylist()
    rows = parse(html).tables["partition-synth"]["rows"]
    assert sorted((r[1][0], r[0][0]) for r in rows) == sorted(
        (m["model"], m["partition"]) for m in models)


def test_sensitivity_is_one_compact_table(full_report) -> None:
    _, _, html = full_report
    p = parse(html)
    assert not [t for t in p.tables if t.startswith("sensitivity-synth-")]  # no per-variant tables
    section = html.split('<section id="sensitivity">', 1)[1].split("</section>", 1)[0]
    assert "<h3>" not in section  # no headings per variant
    summary = p.tables["sensitivity-summary-synth"]
    assert summary["head"] == ["variant", "axis", "rows changed", "node-set-perfect share",
                               "headline shift", "what changes"]
    assert [r[2][0] for r in summary["rows"]] == ["0/8", "1/8"]
    assert [r[4][0] for r in summary["rows"]] == ["+0.0 pp", "+4.5 pp"]
    assert summary["classes"] == ["", "hl"]
    sens = pq.read_table(full_report[0] / "sensitivity.parquet").to_pylist()
    moved = [r["model"] for r in sens if r["changed"]]
    assert summary["rows"][0][5][0] == "—" and moved[0] in summary["rows"][1][5][0]


def test_availability_status_since_and_share(full_report) -> None:
    _, _, html = full_report
    p = parse(html)
    rows = {r[0][0]: r for r in p.tables["availability"]["rows"]}
    assert rows["model-000"][1][0] == "retired" and rows["model-000"][2][0] == "2026-06-20"
    assert rows["model-001"][1][0] == "available" and rows["model-001"][2][0] == "2026-06-01"
    share = {r[0][0]: r[1][0] for r in p.tables["availability-share-synth"]["rows"]}
    assert share["models"] == "1/8 rows (12%)"
    assert "6 measured model(s) have no availability check" in html


def test_pairs_and_correlations_rendered_from_files(full_report) -> None:
    pdir, _, html = full_report
    p = parse(html)
    pairs = pq.read_table(pdir / "pairs.parquet").to_pylist()
    t = p.tables["pairs-synth"]
    assert t["head"][:9] == ["model_a", "model_b", "n_common", "n_nonzero", "mean_diff",
                             "p_zsplit", "p_drop", "rank_biserial", "mdd"]
    assert [float(r[5][1]) for r in t["rows"]] == [r["p_zsplit"] for r in pairs]
    assert len(p.tables["correlations-synth"]["rows"]) == 2
    assert [r[0][0] for r in p.tables["correlations-loo-synth"]["rows"]] == ["model-000", "model-001"]


def test_markdown_has_the_same_sections_and_linked_figures(full_report) -> None:
    _, report_dir, _ = full_report
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    heads = re.findall(r"^## \d\. (.+)$", md, flags=re.M)
    assert heads == ["Headline partition", "Leaderboard", "Plots", "Sensitivity", "Pairs",
                     "Correctness versus stability", "Availability", "Run health", "Provenance"]
    links = re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", md)
    assert len(links) == 6
    for link in links:
        assert (report_dir / link).read_bytes().startswith(PNG_MAGIC)


def test_missing_issue4_files_degrade_to_one_line_notices(tmp_path) -> None:
    write_synthetic_analysis(tmp_path / "out", full=False)
    # strip the interval/rank columns: the model table as the current analyze writes it
    mpath = tmp_path / "out" / "synth" / "models.parquet"
    t = pq.read_table(mpath)
    pq.write_table(t.select(["rank", "model", "n_prompts", "n_cells", "mean_jaccard",
                             "id_stability", "perfect", "mean_nodes"]), mpath)
    paths = build_report(tmp_path / "out", tmp_path / "rep", now=lambda: FIXED_NOW)
    html = paths.html.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([a-z]+)">', html) == SECTION_IDS
    for f in ("pairs", "sensitivity", "drift", "stabilisation", "correlations"):
        assert f"not available: {f}.parquet missing (run irbench analyze)" in html
    assert "not available: models.parquet lacks column(s) partition" in html
    assert len(parse(html).images) == 1  # only the heatmap can be drawn
    lb = parse(html).tables["leaderboard-synth"]
    assert lb["head"] == ["rank", "model", "n", "mean Jaccard", "ID-stability",
                          "node-set-perfect", "warning"]


def test_corrupt_output_file_is_named_not_fatal(tmp_path) -> None:
    pdir = write_synthetic_analysis(tmp_path / "out")
    (pdir / "pairs.parquet").write_bytes(b"PAR1 this is not parquet")
    html = build_report(tmp_path / "out", tmp_path / "rep").html.read_text(encoding="utf-8")
    assert "not available: pairs.parquet unreadable" in html


def test_empty_or_absent_analysis_dir_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ReportInputError, match="does not exist"):
        build_report(tmp_path / "nope", tmp_path / "rep")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportInputError, match="no panel outputs"):
        build_report(tmp_path / "empty", tmp_path / "rep")


def _heatmap_png(tmp_path, missing: float) -> tuple[np.ndarray, str]:
    from matplotlib.image import imread

    write_synthetic_analysis(tmp_path / "out", n_models=4, n_prompts=6, missing=missing)
    html = build_report(tmp_path / "out", tmp_path / "rep").html.read_text(encoding="utf-8")
    src = [s for s in parse(html).images][2]
    return imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png"), html


def test_heatmap_marks_missing_cells_and_has_no_greys(tmp_path) -> None:
    from matplotlib import colormaps

    from analysis.report.plots import HEATMAP_CMAP, MISSING_HATCH
    from analysis.report.sections import heatmap_matrix

    pdir = write_synthetic_analysis(tmp_path / "out", n_models=4, n_prompts=6, missing=0.4)
    cells = pq.read_table(pdir / "cells.parquet")
    order = pq.read_table(pdir / "models.parquet").column("model").to_pylist()
    matrix, names, prompts, dup = heatmap_matrix(cells, order)
    assert names == order and len(prompts) == 6 and not dup
    ref = {(r["model"], r["prompt_name"]): r["mean_jaccard"] for r in cells.to_pylist()}
    for i, mname in enumerate(names):
        for j, pname in enumerate(prompts):
            want = ref.get((mname, pname), np.nan)
            assert (np.isnan(want) and np.isnan(matrix[i, j])) or matrix[i, j] == want
    assert np.isnan(matrix).any()
    # the colormap has no grey anywhere: every sample has a clear hue (channel spread)
    rgb = colormaps[HEATMAP_CMAP](np.linspace(0, 1, 256))[:, :3]
    assert (rgb.max(axis=1) - rgb.min(axis=1)).min() > 0.1
    hatch = np.array([int(MISSING_HATCH[k:k + 2], 16) / 255 for k in (1, 3, 5)])
    img, html = _heatmap_png(tmp_path / "a", 0.4)
    marked = (np.abs(img[..., :3] - hatch).max(axis=-1) < 0.06).sum()
    assert marked > 100  # unmeasured cells are hatched in a hue the colormap never takes
    full, _ = _heatmap_png(tmp_path / "b", 0.0)
    present = np.isnan(heatmap_matrix(pq.read_table(tmp_path / "b" / "out" / "synth" /
                                                    "cells.parquet"), order)[0]).any()
    assert not present  # negative control: nothing unmeasured, so (almost) nothing hatched
    assert (np.abs(full[..., :3] - hatch).max(axis=-1) < 0.06).sum() < marked / 10
    assert "Each tile shows its value." in html and "hatched = not measured" in html


def test_large_panel_stays_small_and_caps_provenance(tmp_path) -> None:
    write_synthetic_analysis(tmp_path / "out", n_models=100, n_prompts=1000, runs=10)
    started = time.monotonic()
    paths = build_report(tmp_path / "out", tmp_path / "rep", now=lambda: FIXED_NOW,
                         options=ReportOptions(max_table_rows=1000))
    elapsed = time.monotonic() - started
    assert paths.html_bytes < 20_000_000, paths.html_bytes
    assert elapsed < 90, elapsed
    html = paths.html.read_text(encoding="utf-8")
    p = parse(html)
    assert len(p.tables["provenance-synth"]["rows"]) == 1000
    assert 'data-page-rows="50"' in html
    assert "showing the first 1000 of" in html
    assert len(p.tables["leaderboard-synth"]["rows"]) == 100
    assert "each tile averages up to 7 adjacent prompts over their measured cells" in html
    print(f"large report: {paths.html_bytes / 1e6:.2f} MB html, {paths.md_bytes / 1e6:.2f} MB md, "
          f"{elapsed:.1f} s")


def test_report_command_runs_analysis_then_report(tmp_path) -> None:
    import typer
    from typer.testing import CliRunner

    from orchestrator.cli.report import report_command
    from storage.records import Outcome, ParseOutcome, RunRecord
    from storage.runs import RunStore

    recs = []
    day = dt.date(2026, 4, 2)
    for mi, model in enumerate(("steady", "shaky")):
        for p in range(4):
            for r in range(3):
                ids = ["A", "B"] + ([f"X{r}"] if mi and r else [])
                recs.append(RunRecord(
                    run_id=f"{model}|{p}|{r}", campaign="c1", panel="main",
                    prompt_sha256=f"sha{p}", prompt_name=f"p{p}.prompt.rtpl", model=model,
                    endpoint="http://127.0.0.1:1/v1", wire_format="openai", run_index=r,
                    instruction_version="v1", instruction_sha256="ab" * 32,
                    measured_at=dt.datetime.combine(day, dt.time(9, r), tzinfo=dt.UTC),
                    measurement_date=day, outcome=Outcome.OK, parse_outcome=ParseOutcome.OK,
                    ir_json=json.dumps({"nodes": [{"id": i} for i in ids]}),
                    node_ids=sorted(ids), node_count=len(ids), temperature=0.0))
    RunStore(tmp_path / "data").write(recs)
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("noop")(lambda: None)  # two commands: typer keeps "report" as a subcommand
    res = CliRunner().invoke(app, ["report", "--data", str(tmp_path / "data"), "--out",
                                   str(tmp_path / "rep"), "--replicates", "200"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "analysis" / "main" / "models.parquet").is_file()
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert "measured 2026-04-02 to 2026-04-02" in html
    prov = parse(html).tables["provenance-main"]
    col = prov["head"].index("outcomes")
    assert {r[col][0] for r in prov["rows"]} == {"ok 3"}
    assert prov["rows"][0][prov["head"].index("instruction_sha256")][0] == "ab" * 6
    models = pq.read_table(tmp_path / "rep" / "analysis" / "main" / "models.parquet").to_pylist()
    lb = parse(html).tables["leaderboard-main"]
    assert [r[1][0] for r in lb["rows"]] == [m["model"] for m in models]
    for anchor in ("partition", "leaderboard", "sensitivity", "pairs", "correctness",
                   "provenance"):
        body = html.split(f'<section id="{anchor}">')[1].split("</section>")[0]
        assert "not available" not in body, anchor
    assert len(parse(html).images) == 5  # everything but the availability timeline
    for row, ref in zip(lb["rows"], models, strict=True):
        assert row[4][0] == f"[{ref['jaccard_ci_low']:.3f}, {ref['jaccard_ci_high']:.3f}]"
    bad = CliRunner().invoke(app, ["report", "--data", str(tmp_path / "nothing"), "--out",
                                   str(tmp_path / "rep2")])
    assert bad.exit_code == 2 and "error" in bad.output


def test_several_panels_get_one_subsection_each_in_every_section(tmp_path) -> None:
    for name, n_models in (("annotated", 6), ("real", 4)):
        write_synthetic_analysis(tmp_path / "out", panel=name, n_models=n_models, n_prompts=10)
    html = build_report(tmp_path / "out", tmp_path / "rep", now=lambda: FIXED_NOW
                        ).html.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([a-z]+)">', html) == SECTION_IDS
    for anchor in ("partition", "leaderboard", "plots", "provenance"):
        body = html.split(f'<section id="{anchor}">')[1].split("</section>")[0]
        assert body.index("<h3>panel annotated</h3>") < body.index("<h3>panel real</h3>")
    p = parse(html)
    assert len(p.tables["leaderboard-annotated"]["rows"]) == 6
    assert len(p.tables["leaderboard-real"]["rows"]) == 4


def test_report_on_the_imported_artifact(tmp_path, artifact_dir) -> None:
    """The published study: import, analyse (few replicates, for speed), report every panel."""
    from analysis.pipeline import run_analysis
    from analysis.options import AnalysisOptions
    from orchestrator.jobs.artifact_import import import_artifact

    mapping = Path(__file__).resolve().parents[2] / "examples" / "artifact_campaigns.toml"
    data, out = tmp_path / "data", tmp_path / "out"
    import_artifact(artifact_dir, data, mapping, fsync=False)
    run_analysis(data, out, AnalysisOptions(replicates=300))
    paths = build_report(out, tmp_path / "rep", data_dir=data, now=lambda: FIXED_NOW)
    html = paths.html.read_text(encoding="utf-8")
    assert "measured 2026-05-30 to 2026-06-11 (some dates are study windows, not stamps)" in html
    p = parse(html)
    for panel in ("annotated", "real", "recovery"):
        models = pq.read_table(out / panel / "models.parquet").to_pylist()
        rows = p.tables[f"leaderboard-{panel}"]["rows"]
        assert [r[1][0] for r in rows] == [m["model"] for m in models]
        assert [float(r[3][1]) for r in rows] == [m["mean_jaccard"] for m in models]
    partition = html.split('<section id="partition">')[1].split("</section>")[0]
    assert "not available" not in partition
    assert paths.html_bytes < 20_000_000


def test_run_health_section_matches_the_raw_runs(tmp_path) -> None:
    from tests.support.viewer_store import MODELS, write_store

    records = write_store(tmp_path / "data")  # panel "pan": retries, 429s, a truncation
    write_synthetic_analysis(tmp_path / "out", panel="pan")
    html = build_report(tmp_path / "out", tmp_path / "rep", data_dir=tmp_path / "data",
                        now=lambda: FIXED_NOW).html.read_text(encoding="utf-8")
    table = parse(html).tables["health-pan"]
    assert table["head"][:4] == ["model", "runs", "outcomes", "retries / run"]
    rows = {r[0][0]: [c[0] for c in r] for r in table["rows"]}
    assert set(rows) == set(MODELS)
    col = {name: i for i, name in enumerate(table["head"])}
    for model in MODELS:
        mine = [r for r in records if r.model == model]
        row = rows[model]
        assert row[col["runs"]] == str(len(mine))
        assert row[col["429s"]] == str(sum(a.status_code == 429 for r in mine for a in r.attempts))
        assert row[col["truncations"]] == str(sum(r.outcome == "truncated" for r in mine))
        retries = np.mean([len(r.attempts) - 1 for r in mine])
        assert float(row[col["retries / run"]]) == pytest.approx(retries, abs=0.005)
        wait = sum(a.retry_after_s or 0 for r in mine for a in r.attempts)
        assert float(row[col["Retry-After s"]]) == pytest.approx(wait, abs=0.005)
        p50 = np.percentile([r.latency_ms for r in mine], 50)
        assert float(row[col["latency p50 ms"]]) == pytest.approx(p50, abs=0.5)
    assert len(parse(html).tables["health-dates-pan"]["rows"]) == 4


def test_leaderboard_rows_link_to_the_viewer(full_report) -> None:
    _, _, html = full_report
    board = html.split('id="leaderboard-synth"', 1)[1].split("</table>", 1)[0]
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', board)
    models = [m["model"] for m in pq.read_table(full_report[0] / "models.parquet").to_pylist()]
    assert [text for _, text in links] == models
    assert [href for href, _ in links] == [f"models/synth/{m}" for m in models]  # relative


def test_markdown_cells_show_endpoint_text_verbatim_and_open_no_tag(tmp_path: Path) -> None:
    """A served model's name is endpoint-given: in a Markdown cell it ends no cell and opens no HTML tag."""
    from analysis.report.doc import Cell, Document, Section, Table
    from analysis.report.md import render_md

    hostile = 'gpt<img src=x onerror="alert(1)">|x'
    table = Table(columns=("model",), rows=((Cell(hostile),),))
    text, _ = render_md(Document(title="t", subtitle="s", sections=(Section(anchor="over-time", title="Over time", blocks=(table,)),)),
                        tmp_path / "figures")
    row = next(line for line in text.splitlines() if "gpt" in line)
    assert "<img" not in text and "&lt;img" in row and "\\|x" in row
    assert row.count(" | ") == 0 and row.startswith("| ") and row.endswith(" |")
