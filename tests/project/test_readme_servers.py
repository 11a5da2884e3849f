"""The README's campaign snippets for llama.cpp, vLLM, Ollama and a gateway are valid campaigns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.campaign.spec import load_campaign
from tests.support.paths import REPO

SECTION = "## Pointing irbench at real servers and gateways"


def _snippets() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[: section.index("\n## ", len(SECTION))] if "\n## " in section[len(SECTION):] else section
    return re.findall(r"```toml\n(.*?)```", section, re.S)


def test_there_is_one_snippet_per_server_kind() -> None:
    kinds = [re.search(r"\[endpoints\.(\w+)\]", s).group(1) for s in _snippets()]
    assert kinds == ["llama", "vllm", "ollama", "gateway"]


@pytest.mark.parametrize("index", range(4))
def test_snippet_is_a_valid_campaign(tmp_path: Path, index: int) -> None:
    snippet = _snippets()[index]
    (tmp_path / "p.prompt.rtpl").write_text("Say hi.\n// @rule RULE:hi\n", encoding="utf-8")
    (tmp_path / "c.toml").write_text(f'name = "readme"\n[corpus]\npaths = ["."]\n{snippet}', encoding="utf-8")
    spec = load_campaign(tmp_path / "c.toml")
    (model,) = spec.models.values()
    endpoint = spec.endpoints[model.endpoint]
    assert endpoint.base_url.startswith("http")
    assert model.name in snippet
