"""The wave pages in a real browser (headless Chromium driven by Playwright, over the real
``irbench view`` on loopback): navigation → waves → a campaign's comparison, then a cell's runs of
both waves and a cross-wave diff by clicking; no console or page error anywhere."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

import pytest
from playwright import sync_api

from tests.support.viewer_store import MODELS, sha_of
from tests.viewer.test_viewer_wave_pages import site  # noqa: F401  (a fixture: pytest finds it by name)

pytestmark = pytest.mark.slow  # a real browser and a real server


def test_waves_and_a_cells_waves_by_clicking(chromium, site) -> None:  # noqa: F811
    client, _ = site
    base = str(client.base_url).rstrip("/")
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.set_default_timeout(30_000)
        pg.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(base + "/")
        with pg.expect_navigation(wait_until="load"):
            pg.click('#irbench-nav a:text-is("Waves")')
        with pg.expect_navigation(wait_until="load"):
            pg.click('#wave-campaigns a:text-is("cam")')
        assert urlsplit(pg.url).path == "/waves/cam"
        assert pg.locator("#wave-models tbody tr").count() == len(MODELS)
        assert pg.inner_text(f'#wave-models tr[data-model="{MODELS[0]}"] td.changed') == "yes"
        pg.goto(base + f"/cells/cam/{quote(MODELS[0], safe='')}/{sha_of(0)}")
        assert pg.locator("#wave-runs thead th[data-wave]").count() == 2
        with pg.expect_navigation(wait_until="load"):
            pg.click("#wave-runs a.compare >> nth=0")
        assert pg.inner_text("#diff") == "Run 0 of wave 1 versus run 0 of wave 2"
        browser.close()
    assert errors == [], errors
