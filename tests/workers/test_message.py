"""The several-runs message body (``workers.celery.message``): shared fields and prompt texts are
sent once, and decoding gives back exactly the tasks that were encoded."""

from __future__ import annotations

import datetime as dt
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.celery.message import decode_runs, encode_runs
from workers.runtask import EndpointRef, ModelLimits, RunTask


def _task(i: int, prompt: int, **extra: object) -> RunTask:
    text = f"instruction\n\nprompt {prompt}: " + "x" * 4000
    return RunTask(
        run_id=f"r{i}", campaign="c", panel="c", model="m", run_index=i % 5,
        endpoint=EndpointRef(name="sim", base_url="http://127.0.0.1:1"), limits=ModelLimits(max_concurrency=4),
        prompt_sha256=f"{prompt:064d}", prompt_name=f"p{prompt}.prompt", user_message=text,
        instruction_version="v1", instruction_sha256="b" * 64, measured_on=dt.date(2026, 12, 2), **extra,
    )


def test_round_trip_sends_each_prompt_text_once() -> None:
    tasks = [_task(i, prompt=i // 5) for i in range(16)]  # 5 runs per prompt: 4 prompts
    body = json.loads(json.dumps(encode_runs(tasks)))  # what the broker carries
    assert decode_runs(body) == tasks
    assert len(body["texts"]) == 4
    assert "run_id" not in body["common"] and body["common"]["model"] == "m"
    whole = len(json.dumps([t.model_dump(mode="json") for t in tasks]))
    assert len(json.dumps(body)) < whole / 3, (len(json.dumps(body)), whole)


def test_the_older_list_form_still_decodes() -> None:
    tasks = [_task(i, prompt=0) for i in range(3)]
    assert decode_runs([t.model_dump(mode="json") for t in tasks]) == tasks


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([None, 0.0, 0.7]), st.sampled_from([None, 256, 8000])),
                min_size=1, max_size=12))
def test_any_mix_of_differing_fields_round_trips(rows: list[tuple[int, float | None, int | None]]) -> None:
    tasks = [_task(i, prompt=p, temperature=temp, max_tokens=mt) for i, (p, temp, mt) in enumerate(rows)]
    assert decode_runs(json.loads(json.dumps(encode_runs(tasks)))) == tasks


def test_common_fields_are_validated_once_and_mutable_ones_never_shared() -> None:
    import pydantic
    import pytest

    tasks = [_task(i, prompt=0, options={"top_p": 0.9}) for i in range(3)]
    body = json.loads(json.dumps(encode_runs(tasks)))
    got = decode_runs(body)
    assert got == tasks
    assert got[1].endpoint is got[0].endpoint and got[2].limits is got[0].limits  # validated once, frozen
    assert got[1].options == got[0].options and got[1].options is not got[0].options  # a dict: one each
    got[0].options["top_p"] = 0.1
    assert got[1].options == {"top_p": 0.9}
    bad_common = json.loads(json.dumps(body))
    bad_common["common"]["limits"] = {"max_concurrency": "many"}
    with pytest.raises(pydantic.ValidationError):
        decode_runs(bad_common)
    bad_run = json.loads(json.dumps(body))
    bad_run["runs"][2]["run_index"] = "third"  # a later run's own field is still validated
    with pytest.raises(pydantic.ValidationError):
        decode_runs(bad_run)
