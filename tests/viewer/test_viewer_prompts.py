"""What a run was asked, the legends, the node-aligned IR diff and the report's navigation, over
real HTTP on one real ``irbench view`` process (store: tests/support/viewer_store.py)."""

from __future__ import annotations

import html as htmllib
import json
import re
from urllib.parse import quote

import httpx
import markupsafe
import pytest

from tests.support.viewer_store import (
    HOSTILE_IMG, HOSTILE_SCRIPT, INSTRUCTION_HEAD, MODELS, PROMPT_ONLY_WORD, analyze, message_of,
    prompt_text_of, report, run_id_of, sha_of, start_viewer, write_store,
)
from viewer.config import ViewerConfig
from viewer.grouping import group_runs
from viewer.node_diff import ADDED, CHANGED, REMOVED, SAME, node_diff

CAP = ViewerConfig(data_dir=".").max_prompt_chars


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer-prompts")
    write_store(root / "data")
    analyze(root / "data", root / "out")
    report(root / "data", root / "out", root / "report")
    proc = start_viewer(root / "data", root / "out", root / "report")
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as c:
            yield c
    finally:
        proc.stop()


def seg(s: str) -> str:
    return quote(s, safe="")


def pre(page: str, element_id: str) -> str:
    """The text of ``<pre id=element_id>`` (unescaped)."""
    m = re.search(rf'<pre id="{element_id}">(.*?)</pre>', page, flags=re.S)
    assert m, f"no <pre id={element_id}>"
    return htmllib.unescape(m.group(1))


def test_run_page_and_api_show_the_prompt_and_the_message(client) -> None:
    rid = run_id_of(1, 1, 0)
    page = client.get(f"/runs/{rid}").text
    assert pre(page, "prompt") == prompt_text_of(1)
    assert pre(page, "message") == message_of(1)
    assert INSTRUCTION_HEAD in page and PROMPT_ONLY_WORD in page
    body = client.get(f"/api/runs/{rid}").json()
    assert body["prompt_text"] == prompt_text_of(1) and body["user_message"] == message_of(1)
    missing = client.get(f"/api/runs/{run_id_of(1, 3, 0)}").json()  # prompt 3: not stored
    assert missing["prompt_text"] is None and missing["user_message"] is None
    assert 'id="prompt-missing"' in client.get(f"/runs/{run_id_of(1, 3, 0)}").text


def test_a_hostile_prompt_renders_as_text(client) -> None:
    for url in (f"/runs/{run_id_of(1, 2, 0)}", f"/cells/cam/{seg(MODELS[1])}/{sha_of(2)}"):
        page = client.get(url).text
        assert HOSTILE_SCRIPT not in page and HOSTILE_IMG not in page, url
        assert str(markupsafe.escape(HOSTILE_SCRIPT)) in page, url  # model 1: not in answers
        assert HOSTILE_SCRIPT in pre(page, "prompt"), url


def test_a_long_prompt_is_clipped_with_a_show_all_link(client) -> None:
    rid = run_id_of(0, 0, 1)
    full = prompt_text_of(0)
    assert len(full) > CAP
    for url in (f"/runs/{rid}", f"/cells/cam/{seg(MODELS[0])}/{sha_of(0)}"):
        page = client.get(url).text
        shown = pre(page, "prompt")
        assert shown == full[:CAP] and "THE LAST LINE" not in shown, url
        link = re.search(r'<a href="(/text/prompt/[^"]+)">show all</a>', page)
        assert link, url
        whole = client.get(link.group(1))
        assert whole.status_code == 200 and whole.text == full
        assert whole.headers["content-type"].startswith("text/plain")
        assert whole.headers["x-content-type-options"] == "nosniff"
    assert client.get(f"/text/message/{rid}").text == message_of(0)
    assert client.get(f"/text/response/{rid}").text.startswith("{")
    assert client.get(f"/text/secrets/{rid}").status_code == 404
    assert client.get(f"/text/prompt/{run_id_of(0, 3, 0)}").status_code == 404  # not stored


def test_search_finds_a_word_only_in_a_prompt(client) -> None:
    page = client.get("/runs", params={"q": PROMPT_ONLY_WORD}).text
    assert re.search(r'<p id="total">9 matching runs', page)
    assert "prompt: " in page and PROMPT_ONLY_WORD in page  # the snippet is from the prompt
    hits = client.get("/api/runs", params={"q": PROMPT_ONLY_WORD, "limit": 500}).json()
    assert {r["prompt_sha256"] for r in hits["runs"]} == {sha_of(1)}
    assert client.get("/api/runs", params={"q": PROMPT_ONLY_WORD + "x"}).json()["total"] == 0


def test_legends_say_what_the_terms_mean(client) -> None:
    def legend(url: str) -> dict[str, str]:
        block = re.search(r'<dl class="legend" id="legend">(.*?)</dl>', client.get(url).text, re.S)
        assert block, url
        return dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", block.group(1)))

    board = legend("/panels/pan")
    assert set(board) == {"rank held", "rank interval", "rank set"}
    assert "share of bootstrap replicates" in board["rank held"]
    assert "simultaneous" in board["rank set"] and "marginal" in board["rank interval"]
    cell = legend(f"/cells/cam/{seg(MODELS[0])}/{sha_of(0)}")
    assert set(cell) == {"run", "drift class"}
    assert "counted from 0" in cell["run"]
    for term in ("count", "id-label", "metadata", "agree", "unparsed"):
        assert term in cell["drift class"], term
    assert "counted from 0" in legend(f"/runs/{run_id_of(0, 0, 0)}")["run"]
    assert "counted from 0" in client.get("/runs").text


def _rows(page: str) -> dict[str, str]:
    """node id → status of the node-diff rows on a cell page ("" = the document row)."""
    return dict(re.findall(r'<tr class="node-\w+" data-node="([^"]*)" data-status="(\w+)">', page))


def test_cell_page_aligns_the_irs_node_by_node(client) -> None:
    model = seg(MODELS[0])
    count = client.get(f"/cells/cam/{model}/{sha_of(0)}",
                       params={"a": run_id_of(0, 0, 0), "b": run_id_of(0, 0, 1)}).text
    assert _rows(count) == {"": SAME, "RULE:a": SAME, "RULE:b": SAME, "COND:c": REMOVED}
    rename = client.get(f"/cells/cam/{model}/{sha_of(0)}",
                        params={"a": run_id_of(0, 0, 0), "b": run_id_of(0, 0, 2)}).text
    assert _rows(rename) == {"": SAME, "RULE:a": SAME, "RULE:b": REMOVED,
                             "RULE:b_renamed": ADDED, "COND:c": SAME}
    assert "renamed to <code>RULE:b_renamed</code>" in rename
    meta = client.get(f"/cells/cam/{model}/{sha_of(1)}",
                      params={"a": run_id_of(0, 1, 0), "b": run_id_of(0, 1, 1)}).text
    assert _rows(meta)["RULE:b"] == CHANGED and _rows(meta)["RULE:a"] == SAME
    marked = [htmllib.unescape(t) for t in re.findall(r'<div class="f d">(.*?)</div>', meta)]
    assert marked == ['    "priority": 1,', '    "priority": 3,']  # only the differing field
    label = client.get(f"/cells/cam/{model}/{sha_of(1)}",
                       params={"a": run_id_of(0, 1, 0), "b": run_id_of(0, 1, 2)}).text
    assert "changed: label" in label and 'id="ir-text-diff"' not in label


def test_unparsed_ir_falls_back_to_a_text_diff(client) -> None:
    page = client.get(f"/cells/cam/{seg(MODELS[1])}/{sha_of(3)}",
                      params={"a": run_id_of(1, 3, 0), "b": run_id_of(1, 3, 2)}).text
    assert 'id="ir-text-diff"' in page and 'id="node-diff"' not in page
    assert 'class="diff"' in page


def test_report_has_the_viewers_navigation(client) -> None:
    resp = client.get("/report")
    assert resp.status_code == 200
    nav = re.search(r'<header class="irbench-nav" id="irbench-nav">(.*?)</header>', resp.text, re.S)
    assert nav, "no viewer navigation on /report"
    for href in ("/", "/runs", "/health", "/report"):
        assert f'href="{href}"' in nav.group(1), href
    assert resp.text.index('id="irbench-nav"') > resp.text.lower().index("<body")
    assert "36 runs" in nav.group(1)
    assert 'id="irbench-nav"' in client.get("/").text  # the same navigation as every page


# ---------------------------------------------------------------- units

def _node(nid: str, line: int, **meta) -> dict:
    return {"id": nid, "kind": "Rule", "label": f"about {nid}",
            "meta": {"priority": 1, "triggers": [], **meta},
            "range": {"start_line": line, "end_line": line}}


def test_node_diff_rows_of_a_known_pair() -> None:
    a = {"version": 1, "nodes": [_node("A", 1), _node("B", 2), _node("C", 3), _node("C", 4)]}
    b = {"version": 2, "nodes": [_node("A", 1), _node("C", 3, priority=2), _node("D", 5),
                                 _node("B2", 2)]}
    d = node_diff(json.dumps(a), json.dumps(b), max_rows=100, renames={"B": "B2"})
    assert d is not None
    assert [(r.node_id, r.status) for r in d.rows] == [
        (None, CHANGED), ("A", SAME), ("B", REMOVED), ("C", CHANGED), ("C", REMOVED),
        ("D", ADDED), ("B2", ADDED)]
    assert d.rows[0].fields == ("version",)
    assert d.rows[3].fields == ("meta.priority",)
    assert [f.text for f in d.rows[3].right if f.differs] == ['    "priority": 2,']
    assert (d.rows[2].rename_of, d.rows[6].rename_of) == ("B2", "B")
    assert d.ids(ADDED) == ["D", "B2"] and d.ids(REMOVED) == ["B", "C"]
    # an id only in B sits before the next node B shares with A
    x = node_diff(json.dumps({"nodes": [_node("P", 1), _node("Q", 2), _node("R", 3)]}),
                  json.dumps({"nodes": [_node("P", 1), _node("Q2", 2), _node("R", 3)]}), max_rows=9)
    assert x is not None and [r.node_id for r in x.rows] == ["P", "Q", "Q2", "R"]
    for row in d.rows:  # each side's lines are the node as JSON
        if row.left and row.node_id is not None:
            node = json.loads("\n".join(f.text for f in row.left))
            assert node in a["nodes"] and node["id"] == row.node_id


def test_node_diff_falls_back_and_bounds() -> None:
    good = json.dumps({"nodes": [_node(f"N{k}", k) for k in range(10)]})
    assert node_diff("{not json", good, max_rows=5) is None
    assert node_diff(good, json.dumps({"nodes": ["x"]}), max_rows=5) is None
    assert node_diff(None, good, max_rows=5) is None
    d = node_diff(good, good, max_rows=4)
    assert d is not None and len(d.rows) == 10 and d.shown == 4 and d.count(SAME) == 10


def test_group_runs_keeps_page_order() -> None:
    runs = [{"run_id": "r1", "k": 2}, {"run_id": "r2", "k": 1}, {"run_id": "r3", "k": 2}]
    [whole] = group_runs(runs)
    assert whole.label == "" and [r["run_id"] for r in whole.runs] == ["r1", "r2", "r3"]
    groups = group_runs(runs, "k")
    assert [(g.label, [r["run_id"] for r in g.runs]) for g in groups] == [
        ("k 2", ["r1", "r3"]), ("k 1", ["r2"])]
