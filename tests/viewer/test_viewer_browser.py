"""``irbench view`` in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright over the real server on loopback.

Follows the reader's path by clicking: campaigns → leaderboard → model → cell → pick two runs
and compare → run page → back up to the cell; applies a filter and a search through the form
and checks the URL carries them; checks that stored ``<script>`` / ``<img onerror>`` answers
render as text and never run; no console error or page error anywhere. Screenshots go to the
test's tmp directory. A negative control shows the same probes catch an injected image.
"""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlsplit

import pytest

from tests.support.viewer_store import (
    HOSTILE_IMG, HOSTILE_SCRIPT, MODELS, analyze, report, run_id_of, sha_of, start_viewer,
    write_store,
)

from playwright import sync_api
pytestmark = pytest.mark.slow  # a real browser and a real server: ~1 min


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer-browser")
    write_store(root / "data")
    analyze(root / "data", root / "out")
    report(root / "data", root / "out", root / "report")
    proc = start_viewer(root / "data", root / "out", root / "report")
    try:
        yield proc.url, root
    finally:
        proc.stop()


@pytest.fixture()
def page(chromium, site):
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium,
                                     args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.set_default_timeout(30_000)
        pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}")
              if m.type in ("error", "warning") else None)
        pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        pg.errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()
    assert errors == [], errors


def nav(pg, selector: str) -> None:
    """Click a link or submit button and wait until the next page has loaded."""
    with pg.expect_navigation(wait_until="load"):
        pg.click(selector)


def path_of(pg) -> str:
    return urlsplit(pg.url).path


def test_reader_path_by_clicking(page, site) -> None:
    base, root = site
    model = MODELS[0]
    page.goto(base + "/")
    nav(page, "#campaigns tbody tr:first-child td:nth-child(2) a")
    assert path_of(page) == "/panels/pan"
    assert page.locator("#leaderboard tbody tr").count() == len(MODELS)
    nav(page, f'#leaderboard a:text-is("{model}")')
    assert path_of(page) == f"/models/pan/{quote(model, safe='')}"
    page.screenshot(path=str(root / "model.png"), full_page=True)
    nav(page, '#cells a:text-is("prompt0.rtpl")')
    assert path_of(page) == f"/cells/cam/{quote(model, safe='')}/{sha_of(0)}"
    assert page.inner_text("#drift-class") == "count"  # default pair: runs 0 and 1
    assert "COND:c" in page.inner_text("#ids")
    assert page.locator('#node-diff tr[data-status="removed"]').count() == 1
    assert "COND:c" in page.inner_text('#node-diff tr[data-status="removed"] td.l')
    assert page.inner_text('#node-diff tr[data-status="removed"] td.r') == ""
    assert page.locator("#legend dt").all_inner_texts() == ["run", "drift class"]
    assert page.inner_text("#prompt").startswith("You are prompt 0.")
    # pick run 2 as B and compare: a rename at the same range
    page.check(f'input[name=b][value="{run_id_of(0, 0, 2)}"]')
    nav(page, "#pick button[type=submit]")
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"a": [run_id_of(0, 0, 0)], "b": [run_id_of(0, 0, 2)]}
    assert page.inner_text("#drift-class") == "id-label"
    assert "RULE:b → RULE:b_renamed" in page.inner_text("#ids")
    page.screenshot(path=str(root / "cell.png"), full_page=True)
    nav(page, "text=run B")
    assert path_of(page) == f"/runs/{run_id_of(0, 0, 2)}"
    assert "RULE:b_renamed" in page.inner_text("#response")
    page.screenshot(path=str(root / "run.png"), full_page=True)
    nav(page, 'nav.crumbs a:text-is("prompt0.rtpl")')  # back up
    assert path_of(page) == f"/cells/cam/{quote(model, safe='')}/{sha_of(0)}"
    nav(page, 'nav.crumbs a:text-is("panel pan")')
    assert path_of(page) == "/panels/pan"


def test_filter_and_search_through_the_form(page, site) -> None:
    base, root = site
    page.goto(base + "/runs")
    assert page.inner_text("#total").startswith("36 matching")
    page.select_option("select[name=model]", MODELS[1])
    page.select_option("select[name=outcome]", "timeout_read")
    nav(page, "form.filters button[type=submit]")
    query = parse_qs(urlsplit(page.url).query)
    assert query["model"] == [MODELS[1]] and query["outcome"] == ["timeout_read"]
    assert page.inner_text("#total").startswith("1 matching")
    assert page.locator("#runlist tbody tr").count() == 1
    page.goto(base + "/runs")
    page.fill("input[name=q]", "Another Label")
    nav(page, "form.filters button[type=submit]")
    assert parse_qs(urlsplit(page.url).query)["q"] == ["Another Label"]
    assert page.inner_text("#total").startswith(f"{len(MODELS)} matching")
    page.screenshot(path=str(root / "search.png"), full_page=True)
    page.goto(base + "/health?by=date")
    page.select_option("select[name=model]", MODELS[0])
    nav(page, "form.filters button[type=submit]")
    query = parse_qs(urlsplit(page.url).query)
    assert query["by"] == ["date"] and query["model"] == [MODELS[0]]
    assert page.locator("#health tbody tr").count() == 4


def test_hostile_answers_are_inert(page, site) -> None:
    base, root = site
    for url in (f"/runs/{run_id_of(0, 2, 0)}", f"/cells/cam/{quote(MODELS[0], safe='')}/{sha_of(2)}",
                "/runs?q=%3Cscript%3E"):
        page.goto(base + url)
        assert page.evaluate("typeof window.__pwned") == "undefined", url
        assert page.evaluate("document.images.length") == 0, url
        assert page.evaluate("document.scripts.length") == 0, url
        assert HOSTILE_SCRIPT in page.evaluate("document.body.textContent"), url  # as text
    page.goto(base + f"/runs/{run_id_of(0, 2, 0)}")
    assert HOSTILE_IMG in page.inner_text("#response")
    assert HOSTILE_SCRIPT in page.inner_text("#reasoning")
    assert HOSTILE_SCRIPT in page.inner_text("#prompt")  # the stored prompt, as text
    page.goto(base + f"/cells/cam/{quote(MODELS[1], safe='')}/{sha_of(2)}")  # only its prompt is hostile
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.images.length") == 0
    assert HOSTILE_IMG in page.inner_text("#prompt")
    page.screenshot(path=str(root / "hostile.png"), full_page=True)


def test_served_report_links_into_the_viewer(page, site) -> None:
    """The static report at /report: its sorting script runs (allowed by hash), the warning
    column is inside a 1400 px window, and a leaderboard row opens the model's viewer page."""
    base, root = site
    page.goto(base + "/report")
    board = "table[id^=leaderboard]"
    page.click(f"{board} thead th:nth-child(4)")  # the report's own script sorts the table
    assert page.get_attribute(f"{board} thead th:nth-child(4)", "aria-sort") == "ascending"
    right = page.evaluate(f"document.querySelector('{board} thead th:last-child')"
                          ".getBoundingClientRect().right")
    assert page.inner_text(f"{board} thead th:last-child") == "warning"
    assert right <= 1400, right
    page.screenshot(path=str(root / "report.png"))
    nav(page, f'{board} a:text-is("{MODELS[1]}")')
    assert path_of(page) == f"/models/pan/{quote(MODELS[1], safe='')}"
    assert page.locator("#cells tbody tr").count() == 4
    page.goto(base + "/report")  # the viewer's navigation, on top of the report
    box = page.locator("#irbench-nav").bounding_box()
    title = page.locator("h1").first.bounding_box()
    assert box is not None and title is not None and box["height"] > 20, box
    assert box["y"] + box["height"] <= title["y"], (box, title)  # above the report's own title
    nav(page, '#irbench-nav a:text-is("Runs")')
    assert path_of(page) == "/runs"


def test_probes_detect_an_injected_image(chromium) -> None:
    """Negative control: unescaped markup makes the same probes fire."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        pg = browser.new_page()
        pg.set_content(f"<pre>{HOSTILE_IMG}</pre>")
        pg.wait_for_function("window.__pwned === 'img'")
        assert pg.evaluate("document.images.length") == 1
        browser.close()


def test_report_warning_column_fits_1400px_with_long_model_names(chromium, tmp_path) -> None:
    """Hosted model names are long; the leaderboard's last column must still be on screen."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from analysis.report.build import build_report
    from tests.support.report_inputs import FIXED_NOW, write_synthetic_analysis

    pdir = write_synthetic_analysis(tmp_path / "out", n_models=8, n_prompts=30, small_models=2)
    long = {f"model-{i:03d}": f"meta-llama/Llama-3.1-405B-Instruct-Turbo-variant-{i:03d}"
            for i in range(8)}
    for name in ("models", "cells"):
        t = pq.read_table(pdir / f"{name}.parquet")
        renamed = pa.array([long[m] for m in t.column("model").to_pylist()])
        pq.write_table(t.set_column(t.column_names.index("model"), "model", renamed),
                       pdir / f"{name}.parquet")
    html = build_report(tmp_path / "out", tmp_path / "rep", now=lambda: FIXED_NOW).html
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.goto(html.as_uri())
        board = "table[id^=leaderboard]"
        assert pg.inner_text(f"{board} thead th:last-child") == "warning"
        right = pg.evaluate(f"document.querySelector('{board} thead th:last-child')"
                            ".getBoundingClientRect().right")
        wrap = pg.evaluate(f"(function(t){{return [t.scrollWidth, t.clientWidth];}})("
                           f"document.querySelector('{board}').parentElement)")
        pg.screenshot(path=str(tmp_path / "long-names.png"))
        browser.close()
    assert right <= 1400 and wrap[0] <= wrap[1], (right, wrap)
    assert pc.sum(pc.equal(pq.read_table(pdir / "models.parquet").column("n_prompts"), 5)).as_py()
