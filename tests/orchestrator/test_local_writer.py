"""The local executor's writer process (``orchestrator/local/writer.py``) over real loopback HTTP
against the simulator: the records it stores are the in-process writer's; when either process
dies, nothing acknowledged is lost and a resume completes the campaign without calling a stored
run again."""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import gc
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.campaign.instruction import load_instruction
from orchestrator.local.executor import LocalOptions, run_local
from orchestrator.local.writer import ProcessWriter, WriterConfig
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.errors import StorageError
from storage.records import Attempt, Outcome, RunRecord
from storage.runs import RunStore
from tests.support.run_records import make_record
from workers.execute import PendingRecord
from workers.providers.base import Reply, ServedIdentity
from workers.runtask import EndpointRef, ModelLimits, ResponseLimits, RetryPolicy, RunTask

MODEL = "sim-mild"
# structure and formatting vary run by run; some calls fail (a RunRecord built on the loop)
SIM = SimConfig(seed=5, models={MODEL: SimModel(drop_prob=0.1, add_rate=0.5, fence_prob=0.5, prose_prob=0.3,
                                                rename_prob=0.1, server_error_prob=0.05)})
# 300 runs on 4 slots take >= 3.75 s: the writer (~1 s to start on a loaded machine) is killed mid-run
SLOW = SimConfig(seed=5, models={MODEL: SimModel(latency_ms_median=50)})
PROCESS = LocalOptions(writer_process_min_runs=0)
INLINE = LocalOptions(writer_process_min_runs=None)
# columns that hold clock readings (or a fresh uuid): the rest must be identical
VOLATILE = {"measured_at", "finished_at", "latency_ms", "total_latency_ms", "first_token_ms",
            "stream_duration_ms", "attempts", "execution_id", "measurement_date"}


def _tasks(base_url: str, n: int, concurrency: int) -> list[RunTask]:
    instr = load_instruction(None)
    prompts = sorted((Path(__file__).resolve().parents[2] / "examples" / "prompts").glob("*.prompt.rtpl"))
    texts = [(p.name, p.read_text()) for p in prompts]
    tasks = []
    for i in range(n):
        name, text = texts[i % len(texts)]
        tasks.append(RunTask(
            run_id=f"w-{i:04d}", campaign="w", panel="w", model=MODEL,
            endpoint=EndpointRef(name="sim", base_url=base_url), limits=ModelLimits(max_concurrency=concurrency),
            retry=RetryPolicy(max_attempts=1), prompt_sha256=f"{i % len(texts):064x}", prompt_name=name,
            run_index=i // len(texts), user_message=instr.render(name, text),
            instruction_version=instr.version, instruction_sha256=instr.sha256,
        ))
    return tasks


def _rows(store: RunStore) -> list[dict]:
    table = store.read_table()
    rows = [{k: v for k, v in row.items() if k not in VOLATILE} for row in table.to_pylist()]
    return sorted(rows, key=lambda r: r["run_id"])


def test_the_writer_process_stores_the_records_the_in_process_writer_stores(tmp_path: Path) -> None:
    stores = {}
    for name, options in (("inline", INLINE), ("process", PROCESS)):
        with start_background(SIM) as sim:  # a fresh simulator: the same answers in the same order
            store = stores[name] = RunStore(tmp_path / name, fsync=False)
            # one call at a time: the simulator's per-prompt counters see the same sequence
            summary = asyncio.run(run_local(_tasks(sim.base_url, 120, 1), store, secrets={}, options=options))
        assert summary.executed == 120
    inline, process = _rows(stores["inline"]), _rows(stores["process"])
    assert len(process) == 120 and process == inline
    outcomes = {(r["outcome"], r["parse_outcome"]) for r in process}
    assert len(outcomes) >= 3  # failures, parsed and repaired answers all went through the child


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (the writer is a fork: the parent's command line), from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def test_a_killed_writer_process_stops_the_run_and_resume_completes_it(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "data", fsync=False)
    options = LocalOptions(writer_process_min_runs=0, flush_interval_s=0.02)
    with start_background(SLOW) as sim:
        tasks = _tasks(sim.base_url, 300, 4)
        others = set(_children(os.getpid()))  # this process's other children (the suite's zygote, say)

        async def main() -> None:
            run = asyncio.create_task(run_local(tasks, store, secrets={}, options=options))
            while len(await asyncio.to_thread(store.completed_run_ids)) < 40:  # some batches acknowledged
                assert not run.done()
                await asyncio.sleep(0.01)
            (pid,) = set(_children(os.getpid())) - others
            os.kill(pid, signal.SIGKILL)
            await run

        with pytest.raises(StorageError, match="writer process") as info:
            asyncio.run(main())
        called = sim.app.state.model_requests[MODEL]
        assert called < 300  # it stopped calling the endpoint once nothing could be stored
        acknowledged = int(re.search(r"(\d+) runs stored", str(info.value)).group(1))
        stored = store.completed_run_ids()
        assert acknowledged >= 40 and len(stored) >= acknowledged  # nothing acknowledged was lost
        todo = [t for t in tasks if t.run_id not in stored]
        summary = asyncio.run(run_local(todo, store, secrets={}, options=options))
        assert summary.executed == len(todo)
        assert sim.app.state.model_requests[MODEL] == called + len(todo)  # no stored run called again
    assert store.read_table().num_rows == 300 and len(store.completed_run_ids()) == 300


_PARENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from tests.orchestrator.test_local_writer import _tasks
    from orchestrator.local.executor import LocalOptions, run_event_loop, run_local
    from storage.runs import RunStore
    from workers.logs import configure_logging
    configure_logging(json=True, level="INFO")  # run_finished lines on stderr: logged once stored
    options = LocalOptions(writer_process_min_runs=0, flush_interval_s=60.0, flush_max_records=100_000)
    run_event_loop(run_local(_tasks(sys.argv[1], 300, 4), RunStore(Path(sys.argv[2]), fsync=False), secrets={},
                             options=options))
""")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False



def _wait_for_calls(sim, parent: subprocess.Popen, n: int, timeout_s: float = 60.0) -> None:
    """Until the simulator has received ``n`` calls for MODEL, failing if ``parent`` dies first."""
    deadline = time.monotonic() + timeout_s
    while sim.app.state.model_requests[MODEL] < n:
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)


def test_a_killed_parent_leaves_its_writer_to_store_what_it_received(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    with start_background(SLOW) as sim:
        parent = subprocess.Popen([sys.executable, "-c", _PARENT, sim.base_url, str(tmp_path / "data"), str(root)])
        try:
            _wait_for_calls(sim, parent, 60)
            (writer,) = _children(parent.pid)
            store = RunStore(tmp_path / "data")
            assert not store.completed_run_ids()  # a 60 s flush interval: nothing written yet
            time.sleep(0.1)  # the last answers reach the writer (sent every few ms)
            parent.send_signal(signal.SIGKILL)
            parent.wait()
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
        deadline = time.monotonic() + 30
        while _alive(writer):
            assert time.monotonic() < deadline, "the writer outlived its parent"
            time.sleep(0.02)
        stored = store.completed_run_ids()
        # the runs it had read, or that sat in the pipe, written on end-of-file (the ones still
        # in the parent's own buffers died with it: never acknowledged, they run again below)
        assert stored
        tasks = _tasks(sim.base_url, 300, 4)
        called = sim.app.state.model_requests[MODEL]
        todo = [t for t in tasks if t.run_id not in stored]
        summary = asyncio.run(run_local(todo, store, secrets={}, options=PROCESS))
        assert summary.executed == len(todo)
        assert sim.app.state.model_requests[MODEL] == called + len(todo)
    assert store.read_table().num_rows == 300


class FullStore(RunStore):
    """A store whose writes fail as on a full disk (pickled into the writer process)."""

    def write(self, records):  # type: ignore[no-untyped-def]
        raise StorageError("cannot write x.parquet: [Errno 28] No space left on device") from OSError(
            errno.ENOSPC, "No space left on device")


def test_a_full_disk_in_the_writer_process_stops_the_run_with_one_actionable_error(tmp_path: Path) -> None:
    with start_background(SLOW) as sim:
        with pytest.raises(StorageError, match="no space left on the device") as info:
            asyncio.run(run_local(_tasks(sim.base_url, 300, 4), FullStore(tmp_path / "data"), secrets={},
                                  options=LocalOptions(writer_process_min_runs=0, flush_interval_s=0.02)))
        assert sim.app.state.model_requests[MODEL] < 300
    assert "0 runs stored" in str(info.value) and "run the same command again" in str(info.value)


def test_ctrl_c_stores_every_finished_run_through_the_writer_process(tmp_path: Path) -> None:
    """A Ctrl-C reaches the whole process group: the writer ignores it and drains what the
    interrupted parent sends it before it exits; the parent logs each run once it is stored."""
    root = Path(__file__).resolve().parents[2]
    with start_background(SLOW) as sim:
        parent = subprocess.Popen([sys.executable, "-c", _PARENT, sim.base_url, str(tmp_path / "data"), str(root)],
                                  stderr=subprocess.PIPE, start_new_session=True)
        try:
            _wait_for_calls(sim, parent, 60)
            (writer,) = _children(parent.pid)
            os.killpg(parent.pid, signal.SIGINT)
            _, err = parent.communicate(timeout=60)
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
        assert not _alive(writer)
    logged = {json.loads(line)["run_id"] for line in err.decode().splitlines()
              if line.startswith("{") and '"run_finished"' in line}
    stored = RunStore(tmp_path / "data").completed_run_ids()
    # a 60 s flush interval: everything stored was written by the drain after the Ctrl-C
    assert len(stored) >= 50 and logged == stored


def test_a_pending_record_comes_out_of_the_pipe_as_the_same_record() -> None:
    """``PendingRecord`` pickles its attempts as dicts: finished in the writer process, it is the
    record the event loop would have finished (but for the fresh execution id)."""
    at = dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc)
    attempts = [
        Attempt(attempt=1, outcome=Outcome.SERVER_ERROR, started_at=at, latency_ms=3.5, status_code=500,
                retry_after_s=1.5, error="boom ü"),
        Attempt(attempt=2, outcome=Outcome.TRUNCATED, started_at=at, latency_ms=4.0, status_code=200, bytes_received=99),
    ]
    answered = {"outcome", "finish_reason", "response_text", "reasoning_text", "answer_chars", "reasoning_chars",
                "prompt_tokens", "completion_tokens", "reasoning_tokens", "first_token_ms", "stream_duration_ms",
                "parse_outcome", "parse_repairs", "ir_json", "node_ids", "node_count", "duplicate_id_count",
                "execution_id", "served_model", "system_fingerprint", "served_digest"}
    record = make_record(1, attempts=attempts, finished_at=at, latency_ms=4.0, total_latency_ms=9.0)
    base = {name: getattr(record, name) for name in RunRecord.model_fields if name not in answered}
    reply = Reply(Outcome.TRUNCATED, '```json\n{"nodes": [{"id": "a", "kind": "Rule"}', "hm", 4.0,
                  finish_reason="length", completion_tokens=7,
                  served=ServedIdentity(model="m-2026", system_fingerprint="fp_x", digest="sha256:ab"))
    pending = PendingRecord(base, reply, ResponseLimits())
    piped = pickle.loads(pickle.dumps([pending], protocol=pickle.HIGHEST_PROTOCOL))[0]
    assert piped.outcome is Outcome.TRUNCATED
    here, there = pending.finish(), piped.finish()
    assert there.model_dump(exclude={"execution_id"}) == here.model_dump(exclude={"execution_id"})
    assert there.attempts == attempts and there.parse_outcome.value == "truncated"
    assert (there.served_model, there.system_fingerprint, there.served_digest) == ("m-2026", "fp_x", "sha256:ab")


def test_the_writer_process_leaves_the_parents_garbage_collector_as_it_was(tmp_path: Path) -> None:
    """The fork happens with every object frozen (so the child's collections never copy the
    parent's heap); the parent is thawed at once, and the records still arrive."""
    store = RunStore(tmp_path / "data", fsync=False)
    stored: list[str] = []

    async def run() -> int:
        writer = ProcessWriter(store, WriterConfig(store, 60.0, 512), lambda run: stored.append(run.run_id))
        await writer.start()
        assert gc.get_freeze_count() == 0
        runner = asyncio.create_task(writer.run())
        for i in range(3):
            writer.add(make_record(i))
        writer.close()
        await runner
        return writer.written

    assert asyncio.run(run()) == 3 and gc.get_freeze_count() == 0
    assert store.completed_run_ids() == {"run-000000", "run-000001", "run-000002"} and stored == []
