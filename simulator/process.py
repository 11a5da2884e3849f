"""Stopping a server that runs in a child process: the simulator's own (``start_subprocess``) and
``orchestrator.cli.llama_server``'s, which may import it (the orchestrator may import ``simulator``;
the simulator may not import the orchestrator, and ``deploy`` is for tests and benchmarks)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM ``process`` and wait up to ``timeout_s`` seconds for it, then SIGKILL it; returns
    once it is reaped. A process that already exited is left as it is."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
