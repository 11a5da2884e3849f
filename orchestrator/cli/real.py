"""``irbench demo-real``: the command function (``cli.py`` registers it); the work is in
``orchestrator.cli.real_demo``, imported only when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def demo_real_command(
    workdir: Annotated[Path, typer.Option(help="Where data, analysis outputs and logs go.")] = Path("irbench-demo-real"),
    examples: Annotated[Path, typer.Option(help="Folder with real/t0.toml, real/t07.toml and prompts/.")] = (
        Path(__file__).resolve().parents[2] / "examples"),
    n_ctx: Annotated[int, typer.Option(help="Context window of the llama.cpp server, in tokens.")] = 2048,
    n_threads: Annotated[int, typer.Option(help="CPU threads of the llama.cpp server (1 is faster on a busy machine).")] = 2,
) -> None:
    """Start llama.cpp with SmolLM2-135M on loopback, run the real campaigns at temperature 0
    and 0.7 (3 runs per cell), analyse them and print the table. Needs the optional
    "real" dependencies (make demo-real installs them).

    Example: irbench demo-real --workdir irbench-demo-real
    """
    from orchestrator.cli.real_demo import run_real_demo
    from workers.errors import IrbenchError
    from workers.logs import configure_logging

    console = Console()
    workdir.mkdir(parents=True, exist_ok=True)
    stream = open(workdir / "irbench.log", "a", encoding="utf-8")
    configure_logging(json=True, stream=stream)
    try:
        run_real_demo(workdir, examples, console, n_ctx=n_ctx, n_threads=n_threads)
    except IrbenchError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(code=2) from None
    finally:
        stream.close()
