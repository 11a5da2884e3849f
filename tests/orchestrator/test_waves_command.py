"""`irbench waves` on a real store: two waves measured against the simulator, one model revised
between them (it drops nodes, and Ollama's /api/tags lists a new digest for it) and one left alone
(the same OpenAI fingerprint); the comparison flags the revised model only, names the
served-identity change, and bad input (one wave, an unfinished wave, a wave not held)
is one line with exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from deploy.processes import free_port
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from tests.support.cli import run_irbench

pytestmark = pytest.mark.slow

PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts"


def _campaign(tmp_path: Path, port: int, revised_endpoint: str = "sim") -> Path:
    path = tmp_path / "wc.toml"
    path.write_text(f'name = "wc"\nruns = 3\n[corpus]\npaths = ["{PROMPTS}"]\n'
                    f'[endpoints.sim]\nbase_url = "http://127.0.0.1:{port}"\n'
                    f'[endpoints.simo]\nbase_url = "http://127.0.0.1:{port}"\nwire_format = "ollama"\n'
                    '[defaults]\nconnect_timeout_s = 2\ntotal_timeout_s = 20\n'
                    f'[models.steady]\nendpoint = "sim"\n[models.revised]\nendpoint = "{revised_endpoint}"\n')
    return path


def _sim(seed: int, revised: SimModel) -> SimConfig:
    return SimConfig(seed=seed, models={"steady": SimModel(drop_prob=0.15, add_rate=0.3), "revised": revised})


def _one_error(out: subprocess.CompletedProcess, says: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr


@pytest.mark.timeout(240)
def test_waves_flags_the_revised_model_and_not_the_steady_one(tmp_path: Path) -> None:
    port, data = free_port(), str(tmp_path / "data")
    campaign = str(_campaign(tmp_path, port, revised_endpoint="simo"))  # revised: Ollama's wire
    before = SimModel(drop_prob=0.15, add_rate=0.3, served_digest="1" * 64)
    with start_background(_sim(1, before), port=port):
        assert run_irbench("run", campaign, "--data", data, "--no-progress").returncode == 0
    _one_error(run_irbench("waves", "--data", data, "--campaign", "wc"), "has one wave")
    _one_error(run_irbench("waves", "--data", data), "no campaign in the store has two waves")
    _one_error(run_irbench("waves", "--data", data, "--alpha", "2"), "--alpha: Input should be less than 1")

    # re-seeded simulator (new noise for both), and the revised model now drops many more nodes
    after = SimModel(drop_prob=0.6, add_rate=0.3, served_digest="2" * 64)  # re-pulled under its name
    with start_background(_sim(2, after), port=port):
        new = run_irbench("run", campaign, "--data", data, "--new-wave", "--no-progress")
        assert new.returncode == 0, new.stderr
    out = run_irbench("waves", "--data", data, "--json")
    assert out.returncode == 0, out.stderr
    (c,) = json.loads(out.stdout)["campaigns"]
    assert (c["campaign"], c["from_wave"], c["to_wave"]) == ("wc", 1, 2)
    models = {m["model"]: m for m in c["models"]}
    assert models["revised"]["changed"] and models["revised"]["q_value"] <= 0.05
    assert models["revised"]["effect"] < -0.1 and models["revised"]["effect_interval"][1] < 0
    assert models["revised"]["served_identity_changed"] is True
    served = {c["column"]: c for c in models["revised"]["served_identity"]}
    assert (served["served_digest"]["from"], served["served_digest"]["to"]) == (["1" * 64], ["2" * 64])
    assert served["served_model"]["changed"] is False and "system_fingerprint" not in served  # Ollama has none
    assert not models["steady"]["changed"] and models["steady"]["served_identity_changed"] is False
    assert {c["column"]: c["changed"] for c in models["steady"]["served_identity"]} == {
        "served_model": False, "system_fingerprint": False}  # OpenAI's wire: no digest
    table = run_irbench("waves", "--data", data, "--campaign", "wc", "--from", "1", "--to", "2")
    assert table.returncode == 0 and "wc: wave 1 -> wave 2" in table.stdout
    assert "served_digest: " in next(line for line in table.stdout.splitlines() if "revised" in line)
    _one_error(run_irbench("waves", "--data", data, "--campaign", "wc", "--to", "3"), "has waves 1, 2, not 3")
    _one_error(run_irbench("waves", "--data", data, "--campaign", "nope"), "holds no runs of campaign 'nope'")


def test_an_unfinished_wave_is_refused(tmp_path: Path) -> None:
    from storage.runs import RunStore
    from storage.schema import table_to_records

    port, data = free_port(), tmp_path / "data"
    campaign = str(_campaign(tmp_path, port))
    with start_background(_sim(1, SimModel()), port=port):
        assert run_irbench("run", campaign, "--data", str(data), "--no-progress").returncode == 0
        assert run_irbench("run", campaign, "--data", str(data), "--new-wave", "--no-progress").returncode == 0
    # drop one of wave 2's runs from the store, as if its worker had not finished it
    store = RunStore(data)
    wave1, wave2 = store.read_table(waves=[1]), store.read_table(waves=[2])
    for f in data.joinpath("runs").rglob("*.parquet"):
        f.unlink()
    store.write(table_to_records(wave1) + table_to_records(wave2.slice(1)))
    assert store.read_table(waves=[2]).num_rows == wave2.num_rows - 1
    _one_error(run_irbench("waves", "--data", str(data), "--campaign", "wc"), "finish the wave")


@pytest.mark.timeout(240)
def test_waves_reports_a_retirement_and_the_availability_change(tmp_path: Path) -> None:
    import datetime as dt

    from storage.availability import Availability, AvailabilityRecord, AvailabilityStore

    port, data = free_port(), str(tmp_path / "data")
    campaign = _campaign(tmp_path, port)
    campaign.write_text(campaign.read_text().replace("runs = 3", "runs = 2"))
    with start_background(_sim(1, SimModel()), port=port):
        assert run_irbench("run", str(campaign), "--data", data, "--no-progress").returncode == 0
    checked = AvailabilityRecord(checked_at=dt.datetime.now(dt.UTC), endpoint="sim", model="revised",
                                 status=Availability.AVAILABLE)  # a scheduled check between the waves
    AvailabilityStore(Path(data)).write([checked])
    gone = SimModel(retired_after_requests=0, retired_on="2026-05-01")  # every call of wave 2 is a 410
    with start_background(_sim(2, gone), port=port):
        new = run_irbench("run", str(campaign), "--data", data, "--new-wave", "--no-progress")
        assert new.returncode == 3 and "revised: 24/24 runs failed" in new.stderr, new.stderr  # the rest cancelled
    held = AvailabilityStore(Path(data)).read(models=["revised"])
    assert set(held["status"].to_pylist()) == {"available", "retired"}  # what the campaign's 410s left in the store
    out = run_irbench("waves", "--data", data, "--json", "--permutations", "99")
    assert out.returncode == 0, out.stderr
    models = {m["model"]: m for m in json.loads(out.stdout)["campaigns"][0]["models"]}
    revised, steady = models["revised"], models["steady"]
    assert revised["retired"]["from"] == 0 and revised["retired"]["to"] > 0 and revised["retired"]["newly_retired"]
    assert revised["to"]["runs_ok"] == 0 and revised["p_value"] is None  # nothing left to test
    assert revised["availability"] == {"from": "available", "to": "retired", "changed": True,
                                       "retired_on": "2026-05-01"}
    assert steady["retired"] == {"from": 0, "to": 0, "newly_retired": False}
    assert steady["availability"] == {"from": None, "to": None, "changed": None, "retired_on": None}
    table = run_irbench("waves", "--data", data, "--permutations", "99")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "revised" in line)
    assert "retired" in row and "available -> retired" in row
