"""``irbench view``: the command function (the CLI module registers it with
``app.command("view")(view_command)``)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.data_option import bucket_of, store_root
from rich.console import Console

from orchestrator.cli.user_errors import fail

if TYPE_CHECKING:
    from viewer import ViewerConfig


def view_command(
    data: Annotated[Path, typer.Option("--data", parser=store_root, help="Dataset root (runs under DATA/runs/).")] = Path("data"),
    analysis: Annotated[Optional[Path], typer.Option(
        "--analysis", help="`irbench analyze` output directory; default: DATA/../out, "
        "DATA/../analysis or DATA/out when one exists.")] = None,
    report: Annotated[Optional[Path], typer.Option(
        "--report", help="`irbench report --out` directory to serve at /report (its leaderboard "
        "links open this viewer); default: DATA/../report when it holds report.html.")] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on (loopback by default; the "
                                      "viewer has no authentication).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one).")] = 8000,
    page_size: Annotated[int, typer.Option(help="Runs per list page.")] = 50,
    threads: Annotated[int, typer.Option(help="Query threads.")] = 2,
    memory_limit_mb: Annotated[int, typer.Option(help="Memory cap of the query engine (MB); its "
                                                 "index file is paged beyond it.")] = 1024,
    wave: Annotated[str, typer.Option("--wave", help="Measurement wave shown: 'latest' (each campaign's), "
                                      "a number, or 'all'.")] = "latest",
    pull_every_s: Annotated[float, typer.Option("--pull-every-s", min=1, help="With an s3:// store: seconds "
                                                "between fetches of what workers added to the bucket.")] = 30.0,
) -> None:
    """Serve a read-only web viewer of the runs: leaderboard → cells → runs side by side.

    Example: irbench view --data data/ --analysis out/
    """
    from storage.wave_selection import WaveSelection
    from viewer import ViewerConfig, find_analysis_dir, find_report

    _check_paths(data, analysis, report)
    session = bucket_of(data)
    if session is not None:
        session.follow(pull_every_s)
    try:
        waves = WaveSelection.parse(wave)
    except ValueError as exc:
        fail(exc)
    report_html = report / "report.html" if report is not None else find_report(data)
    config = ViewerConfig(data_dir=data, analysis_dir=analysis or find_analysis_dir(data), report_html=report_html,
                          page_size=page_size, threads=threads, memory_limit_mb=memory_limit_mb, waves=waves)
    _serve(config, host, port)


def _check_paths(data: Path, analysis: Path | None, report: Path | None) -> None:
    if not (data / "runs").is_dir():
        fail(f"{data / 'runs'} does not exist; pass --data with the directory `irbench run --data` wrote")
    if report is not None and not (report / "report.html").is_file():
        fail(f"--report {report} holds no report.html (write one with `irbench report --out DIR`)")
    if analysis is not None and not analysis.is_dir():
        fail(f"--analysis {analysis} is not a directory")


def _serve(config: ViewerConfig, host: str, port: int) -> None:
    """Load the run index, bind ``host:port`` (0: a free port, reported) and serve until Ctrl-C."""
    import duckdb
    import uvicorn

    from storage.errors import IrbenchError
    from viewer import AnalysisOutputs, RunIndex, create_app

    console = Console(soft_wrap=True)
    try:
        started = time.monotonic()
        outputs = AnalysisOutputs.load(config.analysis_dir)
        index = RunIndex.load(config.data_dir, outputs, threads=config.threads,
                              memory_limit_mb=config.memory_limit_mb, work_dir=config.work_dir, waves=config.waves)
    except (IrbenchError, ValueError, OSError, duckdb.Error) as exc:
        fail(exc)
    console.print(f"loaded {index.n_runs} runs in {time.monotonic() - started:.1f} s; analysis: "
                  f"{config.analysis_dir or 'none found (pass --analysis OUT)'}")
    try:  # bind first, so port 0 can be reported and a taken port is a one-line error
        sock = socket.create_server((host, port))
    except OSError as exc:
        index.close()
        fail(f"cannot listen on {host}:{port}: {exc}")
    server = uvicorn.Server(uvicorn.Config(create_app(index, config), log_level="warning", access_log=False))
    console.print(f"serving http://{host}:{sock.getsockname()[1]}/ (Ctrl-C stops)")
    try:
        server.run(sockets=[sock])
    finally:
        index.close()
