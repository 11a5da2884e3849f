"""Disk full: one clear line, exit code 2, no stray asyncio traceback, and the campaign resumes
once space is freed. Counted on both sides: requests the endpoint answered and runs stored.

With root (CI containers, this machine) the store is a real 1 MiB tmpfs filled up; elsewhere
the same path is taken with a store whose writes raise ENOSPC (an injected writer)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.local.executor import LocalOptions, run_local
from storage.errors import StorageError
from storage.runs import RunStore
from tests.support.campaign_files import one_endpoint, write_campaign
from tests.support.distributed import wait_settled
from tests.support.scripted_server import scripted_server
from workers.runtask import EndpointRef, ModelLimits, RunTask

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}): this test needs root on Linux")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _campaign(tmp_path: Path, base_url: str) -> Path:
    return write_campaign(tmp_path, "full", one_endpoint(base_url), runs=4, prompts=3)


def test_disk_full_is_one_line_and_the_campaign_resumes(tiny_fs: Path, tmp_path: Path) -> None:
    data = tiny_fs / "data"
    data.mkdir()
    with scripted_server() as sim:
        campaign = _campaign(tmp_path, sim.base_url)
        filler = _fill(tiny_fs)
        cmd = [sys.executable, "-m", "orchestrator.cli.app", "run", str(campaign), "--data", str(data), "--no-progress"]
        env = {"PATH": os.environ["PATH"]}
        full = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        first_requests = len(sim.received)
        assert full.returncode == 2, full.stdout + full.stderr
        lines = full.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: no space left on the device"), full.stderr
        assert "run the same command again" in lines[0]
        assert "Traceback" not in full.stderr and "never retrieved" not in full.stderr
        assert list(data.rglob("*.parquet")) == [] and list(data.rglob("*.tmp")) == []
        # the campaign's small records (its wave, prices, prompt texts) are written before the
        # first call, so a disk full from the start may stop the run before it calls at all
        assert 0 <= first_requests <= 12

        filler.unlink()  # space freed
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        assert again.returncode == 0, again.stderr
    assert "12 runs planned, 0 already stored, 12 executed now" in again.stdout
    assert len(sim.received) == first_requests + 12  # every run was executed again, none twice in the store
    store = RunStore(data)
    assert len(store.completed_run_ids("full")) == 12


class _FullStore(RunStore):
    """A store whose first ``fail_times`` writes raise ENOSPC, as a full disk would."""

    def __init__(self, root: Path, fail_times: int) -> None:
        super().__init__(root)
        self.fail_times = fail_times

    def write(self, records):  # type: ignore[no-untyped-def]
        if self.fail_times > 0:
            self.fail_times -= 1
            raise StorageError("cannot write x.parquet: [Errno 28] No space left on device") from OSError(
                errno.ENOSPC, "No space left on device")
        return super().write(records)


def test_injected_enospc_stops_the_executor_and_resume_completes(tmp_path: Path) -> None:
    from orchestrator.campaign.instruction import load_instruction

    instr = load_instruction(None)
    with scripted_server() as sim:
        tasks = [
            # 20 ms per call: 40 calls on 2 slots take >= 0.4 s, far past the first failing flush,
            # however fast the loop (a zero-latency endpoint let a loaded run finish all 40 first)
            RunTask(run_id=f"r{i:03d}", run_index=i, campaign="c", panel="c", model="sleep-0.02",
                    endpoint=EndpointRef(name="s", base_url=sim.base_url), prompt_sha256="c" * 64, prompt_name="p",
                    user_message=instr.render("p", "x"), instruction_version=instr.version,
                    instruction_sha256=instr.sha256, limits=ModelLimits(max_concurrency=2))
            for i in range(40)
        ]
        full = _FullStore(tmp_path / "data", fail_times=1)
        opts = LocalOptions(flush_interval_s=0.05, flush_max_records=1)
        with pytest.raises(StorageError, match="no space left on the device") as info:
            asyncio.run(run_local(tasks, full, secrets={}, options=opts))
        assert "run the same command again" in str(info.value)
        # a call the stopped loop had already written may still be on its way in when the executor raises
        first = wait_settled(lambda: len(sim.received), 0.3, 10, "requests after the executor stopped")
        assert first < 40  # it stopped calling the endpoint once nothing could be stored
        stored = full.completed_run_ids("c")
        todo = [t for t in tasks if t.run_id not in stored]
        summary = asyncio.run(run_local(todo, RunStore(tmp_path / "data"), secrets={}, options=opts))
        assert summary.executed == len(todo) and len(RunStore(tmp_path / "data").completed_run_ids("c")) == 40
        assert len(sim.received) == first + len(todo)
