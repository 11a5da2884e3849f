"""``irbench view`` in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright over the real server on loopback.

Follows the reader's path by clicking: campaigns → leaderboard → model → cell → pick two runs
and compare → run page → back up to the cell; applies a filter and a search through the form
and checks the URL carries them; checks that stored ``<script>`` / ``<img onerror>`` answers
render as text and never run; no console error or page error anywhere. Screenshots go to the
test's tmp directory. A negative control shows the same probes catch an injected image.
"""

from __future__ import annotations

import os
import shutil
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from tests.support.viewer_store import (
    HOSTILE_IMG, HOSTILE_SCRIPT, MODELS, analyze, run_id_of, sha_of, start_viewer, write_store,
)

sync_api = pytest.importorskip("playwright.sync_api")
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def chromium_path() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    msg = "headless Chromium not found; apt-get install -y chromium"
    if os.environ.get("CI"):
        pytest.fail(msg + " — .ci/run must install it")
    pytest.skip(msg)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer-browser")
    write_store(root / "data")
    analyze(root / "data", root / "out")
    proc = start_viewer(root / "data", root / "out")
    try:
        yield proc.url, root
    finally:
        proc.stop()


@pytest.fixture()
def page(chromium_path, site):
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path,
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
    page.screenshot(path=str(root / "hostile.png"), full_page=True)


def test_probes_detect_an_injected_image(chromium_path) -> None:
    """Negative control: unescaped markup makes the same probes fire."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"])
        pg = browser.new_page()
        pg.set_content(f"<pre>{HOSTILE_IMG}</pre>")
        pg.wait_for_function("window.__pwned === 'img'")
        assert pg.evaluate("document.images.length") == 1
        browser.close()
