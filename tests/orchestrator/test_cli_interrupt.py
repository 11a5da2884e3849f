"""Ctrl-C before any run has started (the campaign file still being read): exit 130 and the
same one-line advice as an interrupted campaign, never a silent exit or a traceback."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.terminal import with_default_sigint

REPO = Path(__file__).resolve().parents[2]

# What the generated ``irbench`` script does (``from MODULE import FUNC; sys.exit(FUNC())``),
# with Python's own SIGINT handler and a Ctrl-C that arrives when ``sys.argv[1]`` starts to be
# imported: an audit hook sends the signal, so the interrupt lands inside the CLI's start-up
# imports every time, not at a moment a timer happens to hit.
_CTRL_C_DURING_IMPORT = """
import importlib, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
trigger, target = sys.argv[1], sys.argv[2]
sys.argv = ["irbench", *sys.argv[3:]]
def ctrl_c_on_import(event, args):
    global trigger
    if trigger and event == "import" and args[0] == trigger:
        trigger = None
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(ctrl_c_on_import)
module, _, func = target.partition(":")
sys.exit(getattr(importlib.import_module(module), func)())
"""


def _open_writer(fifo: Path, proc: subprocess.Popen) -> int:
    """Open ``fifo`` for writing once the command has opened it for reading (it then blocks in
    the read: a point inside the command, before the store or any endpoint is touched)."""
    while proc.poll() is None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: no reader yet (the command is still starting)
            if exc.errno != errno.ENXIO:
                raise
            time.sleep(0.05)
    raise AssertionError(f"the command exited ({proc.returncode}) before it read its campaign file")


def test_ctrl_c_while_the_campaign_file_is_read_says_run_again(tmp_path: Path) -> None:
    fifo = tmp_path / "campaign.toml"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        with_default_sigint([sys.executable, "-m", "orchestrator.cli.app", "run", str(fifo), "--data", str(tmp_path / "data")]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    fd = -1
    try:
        fd = _open_writer(fifo, proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if fd >= 0:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert "run the same command again to resume" in " ".join(err.split())
    assert not (tmp_path / "data" / "runs").exists()  # nothing was run


@pytest.mark.parametrize("trigger", ["typer", "pyarrow"])
def test_ctrl_c_while_the_cli_loads_says_run_again(tmp_path: Path, trigger: str) -> None:
    """``typer`` is loaded before any command is known; ``pyarrow`` is loaded for ``status``'s
    store. A Ctrl-C during either import ends like any interrupted command."""
    script = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["irbench"]
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C_DURING_IMPORT, trigger, script,
         "status", str(REPO / "examples" / "demo.toml"), "--data", str(tmp_path / "data")],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "run the same command again to resume" in " ".join(proc.stderr.split())
