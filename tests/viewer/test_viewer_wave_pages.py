"""The viewer's wave pages over real HTTP against a running ``irbench view``: ``/waves/{campaign}``
and ``/api/waves/{campaign}`` show what ``irbench waves --json`` prints for the same store, a
campaign of one wave says a second is needed, and a cell shows its runs of both waves side by
side, labelled with wave number and start time.

The store: the viewer test store (campaign "cam", wave 1) measured again as wave 2, where
model 0 drops a node in every run (a revision) and the others answer as before; and a campaign
"solo" measured once.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from html import unescape
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from storage.runs import RunStore
from storage.waves import record_wave
from tests.support.cli import run_irbench
from tests.support.viewer_store import MODELS, build_records, sha_of, start_viewer, write_store

WAVE2_START = dt.datetime(2026, 12, 1, 8, 30, tzinfo=dt.UTC)


def _wave2(records):
    out = []
    for r in records:
        update = {"run_id": f"w2-{r.run_id}", "wave": 2, "wave_started_at": WAVE2_START,
                  "measured_at": WAVE2_START + dt.timedelta(minutes=r.run_index),
                  "measurement_date": WAVE2_START.date(), "served_model": f"{r.model}-v2",
                  "system_fingerprint": "fp_2"}
        if r.model == MODELS[0] and r.node_ids:
            update["node_ids"] = r.node_ids[:-1]  # the revision: one node fewer in every run
        out.append(r.model_copy(update=update))
    return out


def _solo(records, campaign: str = "solo"):
    return [r.model_copy(update={"run_id": f"{campaign}-{r.run_id}", "campaign": campaign})
            for r in records if r.model == MODELS[2]]


def _half(records):
    """Campaign "half": wave 1 whole, wave 2 one run short (unfinished)."""
    one = _solo(records, "half")
    two = [r.model_copy(update={"run_id": f"w2-{r.run_id}", "wave": 2, "wave_started_at": WAVE2_START})
           for r in one[1:]]
    return one + two


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    data = tmp_path_factory.mktemp("viewer-waves") / "data"
    records = write_store(data)
    record_wave(data, "cam", 2, "a month later", WAVE2_START)
    record_wave(data, "half", 2, None, WAVE2_START)
    RunStore(data, fsync=False).write(_wave2(build_records()) + _solo(records) + _half(records))
    proc = start_viewer(data)
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as client:
            yield client, data
    finally:
        proc.stop()


def _cli_json(data: Path, *args: str) -> dict:
    out = run_irbench("waves", "--data", str(data), "--campaign", "cam", "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _cells(html: str, table_id: str) -> dict[str, dict[str, str]]:
    """model -> td class -> text of the rows of one table."""
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    rows = {}
    for model, row in re.findall(r'<tr data-model="([^"]*)"[^>]*>(.*?)</tr>', body, flags=re.S):
        rows[unescape(model)] = {cls: re.sub(r"<[^>]+>", "", unescape(text)).strip()
                                 for cls, text in re.findall(r'<td class="(?:num )?([a-z-]+)">(.*?)</td>', row, flags=re.S)}
    return rows


def _jac(side: dict) -> str:
    lo, hi = side["jaccard_interval"]
    return f"{side['jaccard']:.3f} [{lo:.3f}, {hi:.3f}]"


def test_the_api_equals_irbench_waves_json(site) -> None:
    client, data = site
    resp = client.get("/api/waves/cam")
    assert resp.status_code == 200
    assert resp.json() == _cli_json(data)
    assert client.get("/api/waves/cam", params={"from": 2, "to": 1}).json() == _cli_json(data, "--from", "2", "--to", "1")


def test_the_page_shows_the_figures_irbench_waves_prints(site) -> None:
    client, data = site
    resp = client.get("/waves/cam")
    assert resp.status_code == 200, resp.text
    (c,) = _cli_json(data)["campaigns"]
    shown = _cells(resp.text, "wave-models")
    assert set(shown) == {m["model"] for m in c["models"]} == set(MODELS)
    for m in c["models"]:
        row = shown[m["model"]]
        lo, hi = m["effect_interval"]
        assert row["changed"] == ("yes" if m["changed"] else "no")
        assert row["p"] == f"{m['p_value']:.3g}" and row["q"] == f"{m['q_value']:.3g}"
        assert row["effect"] == f"{m['effect']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        assert row["from"] == _jac(m["from"]) and row["to"] == _jac(m["to"])
        assert row["from-rank"] == str(m["from"]["rank"]) and row["to-rank"] == str(m["to"]["rank"])
        changes = "; ".join(f"{c['column']}: {', '.join(c['from'])} → {', '.join(c['to'])}"
                            for c in m["served_identity"] if c["changed"])
        assert row["served"] == (changes or {None: "unknown", False: "same"}[m["served_identity_changed"]])
        assert row["retired"].startswith(f"{m['retired']['from']} → {m['retired']['to']}")
    revised = {m["model"]: m for m in c["models"]}[MODELS[0]]
    assert revised["changed"] and shown[MODELS[0]]["changed"] == "yes"
    assert not {m["model"]: m for m in c["models"]}[MODELS[2]]["changed"]
    assert "a month later" in resp.text and "2026-12-01 08:30:00" in resp.text


def test_the_page_is_fast_once_compared(site) -> None:
    client, _ = site
    client.get("/waves/cam")  # the first request compares (and caches)
    started = time.perf_counter()
    for _ in range(5):
        assert client.get("/waves/cam").status_code == 200
    assert (time.perf_counter() - started) / 5 < 0.25


def test_one_wave_says_a_second_is_needed(site) -> None:
    client, _ = site
    resp = client.get("/waves/solo")
    assert resp.status_code == 200
    assert 'id="one-wave"' in resp.text and "irbench run CAMPAIGN --new-wave" in resp.text
    assert 'id="wave-models"' not in resp.text
    api = client.get("/api/waves/solo")
    assert api.status_code == 409 and "has one wave" in api.json()["error"]
    assert client.get("/waves/nope").status_code == 404
    assert client.get("/waves/cam", params={"to": 3}).status_code == 400
    home = client.get("/").text
    assert 'href="/waves/cam"' in home and 'href="/waves"' in home


def test_a_cell_shows_both_waves_side_by_side(site) -> None:
    client, _ = site
    path = f"/cells/cam/{quote(MODELS[0], safe='')}/{sha_of(1)}"
    html = client.get(path).text
    table = html.split('id="wave-runs"', 1)[1].split("</table>", 1)[0]
    heads = re.findall(r'<th data-wave="(\d)">(.*?)</th>', table)
    assert [w for w, _ in heads] == ["1", "2"]
    assert "started 2026-11-01 09:00:00" in heads[0][1]  # wave 1: the first run of the campaign
    assert "a month later" in heads[1][1]
    assert "started 2026-12-01 08:30:00" in heads[1][1]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1], flags=re.S)
    assert len(rows) == 3 and all(r.count("data-run=") == 2 for r in rows)
    assert "RULE:b" in rows[0] and "fp_2" in rows[0]
    link = unescape(re.search(r'class="compare" href="([^"]+)"', rows[0]).group(1))
    diff = client.get(link).text
    assert "Run 0 of wave 1 versus run 0 of wave 2" in unescape(diff)


def test_an_unfinished_wave_is_one_line_as_irbench_waves_says(site) -> None:
    client, data = site
    cli = run_irbench("waves", "--data", str(data), "--campaign", "half")
    assert cli.returncode == 2 and "finish the wave" in cli.stderr
    html = client.get("/waves/half").text
    shown = re.search(r'id="wave-problem">(.*?)</p>', html, flags=re.S)
    assert shown and unescape(shown.group(1)) in cli.stderr and 'id="wave-models"' not in html
    api = client.get("/api/waves/half")
    assert api.status_code == 409 and api.json()["error"] in cli.stderr
