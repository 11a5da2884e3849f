"""Write a small campaign for CLI tests: ``prompts`` prompt files under ``DIR/prompts`` and a
``DIR/<name>.toml`` whose body (endpoints, models, retry) the test gives."""

from __future__ import annotations

from pathlib import Path


def write_campaign(directory: Path, name: str, body: str, *, runs: int, prompts: int = 1) -> Path:
    """The campaign file's path; ``body`` follows ``name``, ``runs`` and ``[corpus]``."""
    folder = directory / "prompts"
    folder.mkdir(exist_ok=True)
    for i in range(prompts):
        (folder / f"p{i}.txt").write_text(f"Rule {i}: always answer in JSON.\n")
    path = directory / f"{name}.toml"
    path.write_text(f'name = "{name}"\nruns = {runs}\n[corpus]\npaths = ["prompts"]\n{body}')
    return path


def one_endpoint(base_url: str, model: str = "ok") -> str:
    """An ``[endpoints.s]`` at ``base_url`` and one ``[models.<model>]``."""
    return f'[endpoints.s]\nbase_url = "{base_url}"\n[models.{model}]\n'
