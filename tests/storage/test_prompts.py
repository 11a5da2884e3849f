"""The ``prompts/`` dataset: texts stored once per (prompt, name, instruction), read back whole."""

from __future__ import annotations

import datetime as dt

from storage.prompts import PromptStore, PromptText, message_key

AT = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)


def _prompt(k: int, instruction: str = "i" * 64) -> PromptText:
    text = f"prompt {k} says <script>alert({k})</script>\n{{% if x %}}"
    return PromptText(f"{k:064x}", f"p{k}.rtpl", instruction, "irbench-v1", text,
                      f"INSTRUCTION\n--- BEGIN PROMPT ---\n{text}\n--- END PROMPT ---")


def test_added_once_and_read_back_exactly(tmp_path) -> None:
    store = PromptStore(tmp_path, fsync=False)
    prompts = [_prompt(k) for k in range(3)]
    assert store.add(prompts, now=AT) == 3
    assert store.add(prompts, now=AT + dt.timedelta(days=1)) == 0  # a resume writes nothing
    assert store.add([*prompts, _prompt(3)], now=AT) == 1
    rows = {r["message_key"]: r for r in store.read().to_pylist()}
    assert set(rows) == {p.key for p in [*prompts, _prompt(3)]}
    for p in prompts:
        assert rows[p.key]["prompt_text"] == p.prompt_text
        assert rows[p.key]["user_message"] == p.user_message
    assert len(store.dataset.data_files()) == 2


def test_a_new_instruction_is_a_new_key(tmp_path) -> None:
    store = PromptStore(tmp_path, fsync=False)
    assert store.add([_prompt(0), _prompt(0, "j" * 64)], now=AT) == 2
    assert message_key("a", "b", "c") != message_key("a", "b", "d")
    assert message_key("a", "b,c", "d") != message_key("a,b", "c", "d")


def test_writers_adding_the_same_prompts_publish_one_file(tmp_path) -> None:
    """Two orchestrators starting the same campaign both see no key stored and both write: the
    file is named by its keys, so the second publish is a no-op."""
    a, b = PromptStore(tmp_path, fsync=False), PromptStore(tmp_path, fsync=False)
    prompts = [_prompt(k) for k in range(2)]
    stored = a.dataset.keys()
    assert stored == set()
    assert a.add(prompts, now=AT) == 2
    b.dataset.keys = lambda **_: set()  # type: ignore[method-assign]  # as if it looked first
    assert b.add(prompts, now=AT) == 0
    assert a.read().num_rows == 2 and len(a.dataset.data_files()) == 1
