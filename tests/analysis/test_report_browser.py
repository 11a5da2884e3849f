"""The report in a real browser: headless Chromium (Debian's ``chromium``) with networking off.

Checks that the page renders all eight sections, that every image is an embedded PNG the browser
decoded (naturalWidth > 0), that no script error or console error occurs, that the sortable-table
script sorts and pages, and takes a screenshot. A negative control proves the probes can fail.
When ``CI`` is set a missing chromium FAILS the test (``.ci/run`` must install it); locally it
skips.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.report.build import build_report
from tests.support.report_inputs import (
    FIXED_NOW, PNG_MAGIC, SECTION_IDS, parse, write_availability, write_synthetic_analysis,
)

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: Runs before the report's own script: records uncaught errors and console.error calls.
PROBE_HEAD = ("<script>window.__errs=[];window.addEventListener('error',function(e){"
              "window.__errs.push(String(e.message));});var __ce=console.error;console.error="
              "function(){window.__errs.push('console.error: '+Array.prototype.join.call("
              "arguments,' '));__ce.apply(console,arguments);};</script>")
#: Runs after load: image decode state, a click on the leaderboard's "mean Jaccard" header.
PROBE_TAIL = """<script>window.addEventListener('load',function(){
var imgs=Array.prototype.map.call(document.images,function(i){return i.complete?i.naturalWidth:-1;});
document.body.setAttribute('data-imgs',JSON.stringify(imgs));
var t=document.querySelector('table[id^=leaderboard]');
if(t){var th=t.tHead.rows[0].cells[3];th.click();
document.body.setAttribute('data-sorted',JSON.stringify(Array.prototype.map.call(
t.tBodies[0].rows,function(r){return r.cells[1].textContent;})));}
var p=document.querySelector('table[id^=provenance]');
if(p){document.body.setAttribute('data-visible',String(Array.prototype.filter.call(
p.tBodies[0].rows,function(r){return r.style.display!=='none';}).length));}
document.body.setAttribute('data-errs',JSON.stringify(window.__errs));});</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    msg = ("headless Chromium not found (looked for " + ", ".join(BROWSERS) + "); install "
           "Debian's package: apt-get update && apt-get install -y chromium")
    pytest.fail(msg)


def run_browser(binary: str, page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    """Load ``page`` offline (proxy to a closed port, every host unresolvable) and return the
    finished process (stdout = DOM for --dump-dom; stderr = browser log incl. console lines)."""
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=5000", *extra, page.resolve().as_uri()]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def console_errors(stderr: str) -> list[str]:
    """Console lines of the page that are errors (Chromium logs them as INFO:CONSOLE)."""
    return [line for line in stderr.splitlines()
            if ":CONSOLE" in line and ("Uncaught" in line or "Error" in line or ":ERROR:" in line)]


def probed(src: Path, dst: Path) -> Path:
    html = src.read_text(encoding="utf-8")
    html = html.replace("<head>", "<head>" + PROBE_HEAD, 1).replace("</body>", PROBE_TAIL + "</body>", 1)
    dst.write_text(html, encoding="utf-8")
    return dst


def body_attr(dom: str, name: str) -> object:
    m = re.search(rf"<body[^>]*\s{name}=\"([^\"]*)\"", dom)
    assert m, f"probe attribute {name} missing; the load handler did not run"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("browser")
    write_synthetic_analysis(root / "out", n_models=8, n_prompts=120, small_models=1)
    write_availability(root / "data", [("model-000", dt.date(2026, 6, 1), "available"),
                                       ("model-000", dt.date(2026, 6, 9), "retired")])
    paths = build_report(root / "out", root / "rep", data_dir=root / "data", now=lambda: FIXED_NOW)
    return paths.html, root


def test_report_renders_offline_with_images_and_no_errors(chromium, report) -> None:
    html, root = report
    plain = run_browser(chromium, html, root / "profile-a")
    assert console_errors(plain.stderr) == []
    dom = run_browser(chromium, probed(html, root / "probed.html"), root / "profile-b",
                      "--dump-dom").stdout
    assert re.findall(r'<section id="([a-z]+)">', dom) == SECTION_IDS
    assert "irbench report — measured 2026-05-30 to 2026-06-11" in dom
    imgs = body_attr(dom, "data-imgs")
    assert len(imgs) == 6 and all(w > 0 for w in imgs), imgs
    for src in parse(dom).images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert body_attr(dom, "data-errs") == []
    # sorting: one click on "mean Jaccard" sorts ascending
    models = pq.read_table(root / "out" / "synth" / "models.parquet").to_pylist()
    want = [m["model"] for m in sorted(models, key=lambda m: m["mean_jaccard"])]
    assert body_attr(dom, "data-sorted") == want
    # paging: the provenance table shows one page of 50 rows
    assert body_attr(dom, "data-visible") == 50


def test_screenshot_shows_a_rendered_page(chromium, report) -> None:
    from matplotlib.image import imread

    html, root = report
    shot = root / "shot.png"
    run_browser(chromium, html, root / "profile-c", f"--screenshot={shot}",
                "--window-size=1280,4000")
    img = imread(shot)
    assert img.shape[:2] == (4000, 1280)
    # a rendered page has text and figures: many distinct colours, not a blank canvas
    flat = (img[..., :3] * 255).astype(int).reshape(-1, 3)
    assert len({tuple(p) for p in flat[:: 97]}) > 50


def test_probes_detect_errors_and_broken_images(chromium, tmp_path) -> None:
    """Negative control: the same probes flag a script error and an undecodable image."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head></head><body><img src=\"data:image/png;base64,"
                   "AAAA\"><script>undefinedFunction();</script></body></html>", encoding="utf-8")
    plain = run_browser(chromium, bad, tmp_path / "p1")
    assert any("Uncaught" in line for line in console_errors(plain.stderr))
    dom = run_browser(chromium, probed(bad, tmp_path / "bad-probed.html"), tmp_path / "p2",
                      "--dump-dom").stdout
    assert body_attr(dom, "data-imgs") == [0]
    assert any("undefinedFunction" in e for e in body_attr(dom, "data-errs"))


def test_large_panel_report_opens(chromium, tmp_path) -> None:
    """100 models × 1,000 prompts: under 20 MB, and the browser renders it without errors."""
    write_synthetic_analysis(tmp_path / "out", n_models=100, n_prompts=1000, runs=10)
    paths = build_report(tmp_path / "out", tmp_path / "rep", now=lambda: FIXED_NOW)
    assert paths.html_bytes < 20_000_000
    plain = run_browser(chromium, paths.html, tmp_path / "pa")
    assert console_errors(plain.stderr) == []
    dom = run_browser(chromium, probed(paths.html, tmp_path / "probed.html"), tmp_path / "pb",
                      "--dump-dom").stdout
    assert re.findall(r'<section id="([a-z]+)">', dom) == SECTION_IDS
    imgs = body_attr(dom, "data-imgs")
    assert len(imgs) == 5 and all(w > 0 for w in imgs), imgs
    assert body_attr(dom, "data-errs") == []
    assert body_attr(dom, "data-visible") == 50
    assert len(body_attr(dom, "data-sorted")) == 100
