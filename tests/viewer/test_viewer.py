"""``irbench view`` over real HTTP: the JSON API, stable URLs, run health and refusals.

One real ``irbench view`` process per module, over a hand-built store whose every expected
figure is computed here from the records (tests/support/viewer_store.py), plus the real
``irbench analyze`` outputs of that store.
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

import httpx
import numpy as np
import re
from html import escape as html_escape

import pytest

from tests.support.viewer_store import (
    HOSTILE_IMG, HOSTILE_SCRIPT, MODELS, PROMPT_ONLY_WORD, analyze, prompt_text_of,
    run_id_of, sha_of, start_viewer, write_store,
)
from viewer.diff import pair_diff, text_diff
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer")
    records = write_store(root / "data")
    analyze(root / "data", root / "out")
    proc = start_viewer(root / "data", root / "out")
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as client:
            yield client, records
    finally:
        proc.stop()


def seg(s: str) -> str:
    return quote(s, safe="")


def _stored_prompt(r) -> str:
    """The stored prompt text of a record's prompt ("" for prompt 3, whose text is not stored)."""
    p = [sha_of(k) for k in range(4)].index(r.prompt_sha256)
    return prompt_text_of(p) if p < 3 else ""


def _asked_or_answered(word: str):
    return lambda r: word.lower() in ((r.response_text or "") + _stored_prompt(r)).lower()


def test_api_runs_filters_match_the_records(viewer) -> None:
    client, records = viewer
    body = client.get("/api/runs", params={"limit": 500}).json()
    assert body["total"] == len(records) == 36
    assert {r["run_id"] for r in body["runs"]} == {r.run_id for r in records}
    keys = {"run_id", "model", "prompt_sha256", "run_index", "outcome", "measured_at"}
    assert keys <= set(body["runs"][0])
    cases = [
        ({"model": MODELS[1]}, lambda r: r.model == MODELS[1]),
        ({"outcome": "truncated"}, lambda r: r.outcome == "truncated"),
        ({"prompt_sha256": sha_of(1), "campaign": "cam"}, lambda r: r.prompt_sha256 == sha_of(1)),
        ({"date_from": "2026-11-02", "date_to": "2026-11-03"},
         lambda r: dt.date(2026, 11, 2) <= r.measurement_date <= dt.date(2026, 11, 3)),
        ({"q": "ANOTHER LABEL"}, _asked_or_answered("another label")),
        ({"q": "<script>"}, _asked_or_answered("<script>")),
        ({"q": PROMPT_ONLY_WORD.upper()}, lambda r: r.prompt_sha256 == sha_of(1)),
        ({"q": "You are prompt 3"}, lambda r: False),  # its text is not stored
        ({"model": MODELS[0], "outcome": "ok", "date_from": "2026-11-02"},
         lambda r: r.model == MODELS[0] and r.outcome == "ok"
         and r.measurement_date >= dt.date(2026, 11, 2)),
    ]
    for params, keep in cases:
        want = {r.run_id for r in records if keep(r)}
        got = client.get("/api/runs", params={**params, "limit": 500}).json()
        assert got["total"] == len(want) and {r["run_id"] for r in got["runs"]} == want, params
        assert want or params["q"].startswith("You are"), f"case {params} selects nothing"
    # the prompt-only word is in no answer: only the prompt text can have found it
    assert not any(PROMPT_ONLY_WORD in (r.response_text or "") for r in records)
    assert not any("<script>" in (r.response_text or "") for r in records if r.model != MODELS[0])


def test_api_runs_pages_partition_the_result(viewer) -> None:
    client, records = viewer
    seen = []
    for offset in range(0, 40, 7):
        page = client.get("/api/runs", params={"limit": 7, "offset": offset}).json()
        assert page["total"] == 36 and len(page["runs"]) == min(7, max(0, 36 - offset))
        seen += [r["run_id"] for r in page["runs"]]
    assert len(seen) == 36 and set(seen) == {r.run_id for r in records}
    capped = client.get("/api/runs", params={"limit": 10**6}).json()
    assert capped["limit"] == 500  # capped: the store is never sent whole


def test_bad_parameters_are_one_line_400s(viewer) -> None:
    client, _ = viewer
    for params in ({"date_from": "yesterday"}, {"limit": "0"}, {"offset": "-1"},
                   {"colour": "red"}, {"q": "x" * 501}):
        resp = client.get("/api/runs", params=params)
        assert resp.status_code == 400, params
        assert "\n" not in resp.json()["error"] and resp.json()["error"].startswith("bad query")
    assert client.get("/health", params={"by": "week"}).status_code == 400


def test_api_cell_ids_and_pairwise_drift_classes(viewer) -> None:
    client, records = viewer
    model = MODELS[0]
    cell = client.get(f"/api/cells/cam/{seg(model)}/{sha_of(0)}").json()
    assert cell["total_runs"] == 3 and cell["model"] == model
    want_ids = {r.run_id: r.node_ids for r in records if r.model == model
                and r.prompt_sha256 == sha_of(0)}
    assert {r["run_id"]: r["node_ids"] for r in cell["runs"]} == want_ids
    pairs = {(p["run_a"], p["run_b"]): p for p in cell["pairs"]}
    r0, r1, r2 = (run_id_of(0, 0, k) for k in range(3))
    assert len(pairs) == 3
    assert pairs[(r0, r1)]["drift_class"] == "count"
    assert pairs[(r0, r1)]["ids_removed"] == ["COND:c"] and pairs[(r0, r1)]["count_b"] == 2
    assert pairs[(r0, r2)]["drift_class"] == "id_label"
    assert pairs[(r0, r2)]["renamed"] == [{"before": "RULE:b", "after": "RULE:b_renamed",
                                           "matched_on": "range"}]
    assert pairs[(r0, r2)]["ids_added"] == [] and pairs[(r0, r2)]["ids_removed"] == []
    meta = client.get(f"/api/cells/cam/{seg(model)}/{sha_of(1)}").json()
    mp = {(p["run_a"], p["run_b"]): p for p in meta["pairs"]}
    a, b, c = (run_id_of(0, 1, k) for k in range(3))
    assert mp[(a, b)]["drift_class"] == "metadata"
    assert [(x["node_id"], x["field"], x["before"], x["after"])
            for x in mp[(a, b)]["metadata_changed"]] == [("RULE:b", "meta.priority", "1", "3")]
    assert mp[(a, c)]["drift_class"] == "agree" and mp[(a, c)]["label_only"] is True
    assert mp[(a, c)]["labels_changed"][0]["after"] == "another label"


def test_pair_diff_and_text_diff_units() -> None:
    """The diff helpers on their own: a failed run is "unparsed"; the text diff's changed lines
    are exactly difflib's."""
    assert pair_diff("a", None, "b", '{"nodes":[]}').drift_class == "unparsed"
    left = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten"
    right = left.replace("two", "TWO").replace("nine\n", "")
    d = text_diff(left, right, max_lines=100, context=1)
    changed = [(r.tag, r.left, r.right) for r in d.rows if r.tag not in ("equal", "skip")]
    assert changed == [("replace", "two", "TWO"), ("delete", "nine", "")]
    assert any(r.tag == "skip" for r in d.rows)
    assert text_diff("same", "same", max_lines=5).identical


def test_stable_urls_answer_and_link_back_up(viewer) -> None:
    client, records = viewer
    for model in MODELS:
        rid = run_id_of(MODELS.index(model), 0, 0)
        pages = {
            "/": [],
            "/panels/pan": [f"/models/pan/{seg(model)}"],
            f"/models/pan/{seg(model)}": ["/panels/pan", f"/cells/cam/{seg(model)}/{sha_of(0)}"],
            f"/cells/cam/{seg(model)}/{sha_of(0)}": [f"/models/pan/{seg(model)}", f"/runs/{rid}"],
            f"/runs/{rid}": [f"/cells/cam/{seg(model)}/{sha_of(0)}", f"/models/pan/{seg(model)}"],
        }
        for url, links in pages.items():
            resp = client.get(url)
            assert resp.status_code == 200, url
            assert 'href="/"' in resp.text, url  # every page links home
            for link in links:
                assert f'href="{link}' in resp.text.replace("&amp;", "&"), (url, link)
    run = client.get(f"/runs/{run_id_of(0, 1, 2)}").text
    assert "another label" in run  # the stored response text is on the run page
    assert client.get("/runs/nope").status_code == 404
    assert client.get(f"/cells/cam/{seg(MODELS[0])}/nope").status_code == 404
    assert client.get("/api/runs/nope").json()["error"].startswith("no run")


def test_leaderboard_shows_the_analysis_partition_and_rank_sets(viewer) -> None:
    client, _ = viewer
    html = client.get("/panels/pan").text
    assert "clearly" in html or "undetermined" in html
    assert 'id="leaderboard"' in html and "rank set" in html and "CI coverage" in html
    assert re.search(r'<td class="num( flag-low)?">(0\.\d\d|1\.00)( \(low\))?</td>', html)
    for model in MODELS:
        assert f"/models/pan/{seg(model)}" in html


def test_health_figures_match_the_records(viewer) -> None:
    client, records = viewer
    groups = {g["key"]: g for g in client.get("/api/health").json()["groups"]}
    assert set(groups) == set(MODELS)
    for model in MODELS:
        mine = [r for r in records if r.model == model]
        g = groups[model]
        assert g["runs"] == len(mine)
        assert g["outcomes"] == {o: sum(r.outcome == o for r in mine)
                                 for o in {r.outcome.value for r in mine}}
        assert g["retries_per_run"] == pytest.approx(np.mean([len(r.attempts) - 1 for r in mine]))
        assert g["http_429"] == sum(a.status_code == 429 for r in mine for a in r.attempts)
        assert g["retry_after_s"] == pytest.approx(
            sum(a.retry_after_s or 0 for r in mine for a in r.attempts))
        assert g["truncations"] == sum(r.outcome == "truncated" for r in mine)
        lat = [r.latency_ms for r in mine]
        assert g["latency_p50_ms"] == pytest.approx(np.percentile(lat, 50))
        assert g["latency_p90_ms"] == pytest.approx(np.percentile(lat, 90))
        assert g["completion_tokens"] == sum(r.completion_tokens for r in mine)
    assert groups[MODELS[0]]["http_429"] == 3 and groups[MODELS[1]]["http_429"] == 2
    by_date = client.get("/api/health", params={"by": "date", "model": MODELS[1]}).json()
    assert [g["key"] for g in by_date["groups"]] == [f"2026-11-0{d}" for d in range(1, 5)]
    assert sum(g["runs"] for g in by_date["groups"]) == 12
    html = client.get("/health", params={"by": "date", "model": MODELS[1]}).text
    assert html.count("<tr>") >= 5 and "Retry-After" in html


def test_write_methods_are_refused(viewer) -> None:
    client, records = viewer
    urls = ["/", "/api/runs", f"/runs/{records[0].run_id}", f"/api/runs/{records[0].run_id}",
            f"/cells/cam/{seg(MODELS[0])}/{sha_of(0)}", "/health"]
    for url in urls:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert client.request(method, url).status_code == 405, (method, url)
    assert client.get("/api/runs").json()["total"] == 36  # nothing changed


def test_pages_escape_model_output_and_forbid_scripts(viewer) -> None:
    client, _ = viewer
    for url in (f"/runs/{run_id_of(0, 2, 0)}", f"/cells/cam/{seg(MODELS[0])}/{sha_of(2)}",
                f"/runs?q={quote('<script>')}"):
        resp = client.get(url)
        assert resp.status_code == 200
        assert HOSTILE_SCRIPT not in resp.text and HOSTILE_IMG not in resp.text, url
        assert "&lt;script&gt;" in resp.text, url
        assert "script-src" not in resp.headers["content-security-policy"]  # default-src 'none'
        assert "default-src 'none'" in resp.headers["content-security-policy"]
    # model names needing escaping are escaped in text and in URLs
    assert "model b&amp;c?" in client.get("/panels/pan").text
    assert f"/models/pan/{seg(MODELS[1])}" in client.get("/panels/pan").text


def test_cli_user_errors_are_one_line(tmp_path) -> None:
    proc = run_cli(["view", "--data", str(tmp_path / "missing")], timeout_s=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "does not exist" in proc.stderr


def test_index_shows_the_latest_execution_of_a_run_across_dates(tmp_path) -> None:
    """A run re-executed on a later date (a --retry-failed) shows its newer execution, the
    store's EXECUTION_RULE, not the first one ever stored."""
    from storage.runs import RunStore
    from tests.support.viewer_store import build_records
    from viewer.index import RunIndex

    first = build_records()[0]
    later = first.model_copy(update={
        "execution_id": "e-later", "response_text": "the later answer",
        "measured_at": first.measured_at + dt.timedelta(days=1),
        "finished_at": first.measured_at + dt.timedelta(days=1, seconds=1),
        "measurement_date": first.measurement_date + dt.timedelta(days=1),
    })
    store = RunStore(tmp_path / "data", fsync=False)
    store.write([first])
    store.write([later])
    index = RunIndex.load(tmp_path / "data")
    try:
        assert index.n_runs == 1
        assert index.run(first.run_id)["response_text"] == "the later answer"
    finally:
        index.close()


def test_home_shows_spend_per_model_of_every_execution(tmp_path) -> None:
    """The spend table counts every execution (a run executed twice was paid twice), at the
    prices recorded for its campaign, and says 'unknown' without them."""
    from storage.prices import TokenPrice, write_prices
    from storage.runs import RunStore
    from tests.support.viewer_store import build_records
    from viewer.index import RunIndex

    first = build_records()[0].model_copy(update={"prompt_tokens": 1000, "completion_tokens": 200})
    later = first.model_copy(update={
        "execution_id": "e-later", "prompt_tokens": 3000, "completion_tokens": 400,
        "finished_at": first.measured_at + dt.timedelta(seconds=5),
    })
    store = RunStore(tmp_path / "data", fsync=False)
    store.write([first])
    store.write([later])
    write_prices(tmp_path / "data", first.campaign, {first.model: TokenPrice(input_usd_per_mtok=1.0,
                                                                              output_usd_per_mtok=10.0)})
    index = RunIndex.load(tmp_path / "data")
    try:
        assert index.n_runs == 1
        [row] = index.spend
        assert (row["model"], row["executions"], row["prompt_tokens"], row["completion_tokens"]) == (
            first.model, 2, 4000, 600)
        assert row["cost_usd"] == pytest.approx((4000 * 1.0 + 600 * 10.0) / 1e6)
    finally:
        index.close()


def test_home_page_has_the_spend_table(viewer) -> None:
    client, records = viewer
    html = client.get("/").text
    assert '<table id="spend">' in html
    section = html[html.index('<table id="spend">'):html.index("<h2>Panels</h2>")]
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>", section)
    expected: dict[tuple[str, str], list[int]] = {}
    for r in records:
        e = expected.setdefault((html_escape(r.campaign), html_escape(r.model)), [0, 0])
        e[0] += 1
        e[1] += r.prompt_tokens or 0
    assert {(c, m): [int(n), int(p)] for c, m, n, p in rows} == expected
