"""Ad-hoc runs: ``irbench run --model NAME --base-url URL --prompts DIR`` without a TOML file.

The flags are turned into the equivalent campaign TOML, written beside the data as
``DATA/campaigns/<name>.toml`` (its provenance), and then loaded through the same validator as
any campaign file, so an ad-hoc run is an ordinary campaign: the same command run again has the
same name and plan, so it resumes (and ``--retry-failed`` works on it), and the written file can
be passed to ``irbench run``/``status`` directly.

The derived name is ``adhoc-<model>-<8 hex>``; the hex digest covers what identifies the
measurement (model, endpoint URL and wire format, the prompts folder, max_tokens, temperature)
but not ``runs``, so raising ``--runs`` extends the same campaign instead of starting a new one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.campaign.spec_checks import ENV_NAME_RE, SLUG_RE, looks_like_key
from workers.errors import ConfigError

CAMPAIGNS_DIR = "campaigns"
ENDPOINT_NAME = "adhoc"
_NAME_MODEL_CHARS = 60


class AdhocRun(BaseModel):
    """The flags of an ad-hoc ``irbench run``. ``temperature`` None = not sent; ``max_tokens`` None = no cap."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1)
    base_url: str = Field(min_length=1)
    prompts: Path
    wire_format: str = "openai"
    api_key_env: str | None = None
    runs: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    name: str | None = None

    def campaign_name(self) -> str:
        """``--name``, or a name derived from the flags that identify the measurement."""
        if self.name:
            if not SLUG_RE.match(self.name):
                raise ConfigError(f"--name {self.name!r}: use letters, digits, '.', '_' or '-' (e.g. 'gemma-check')")
            return self.name
        identity = json.dumps(
            [self.model, self.base_url.rstrip("/"), self.wire_format, str(self.prompts.resolve()),
             self.max_tokens, self.temperature],
            separators=(",", ":"),
        )
        digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", self.model).strip("-._")[:_NAME_MODEL_CHARS] or "model"
        return f"adhoc-{slug}-{digest}"

    def check(self) -> None:
        """Problems the user can fix before anything is written (one ConfigError listing them)."""
        problems = []
        if self.wire_format not in ("openai", "ollama"):
            problems.append(f"--wire-format {self.wire_format!r}: use 'openai' or 'ollama'")
        if self.api_key_env is not None and (looks_like_key(self.api_key_env) or not ENV_NAME_RE.match(self.api_key_env)):
            problems.append("--api-key-env takes the NAME of an environment variable (e.g. OPENAI_API_KEY), never the key")
        if not self.prompts.is_dir():
            problems.append(f"--prompts {self.prompts}: not a folder of prompt files")
        if problems:
            raise ConfigError("invalid ad-hoc run", problems)

    def to_toml(self, today: dt.date) -> str:
        """The equivalent campaign file (paths absolute, so it loads from anywhere)."""
        q = json.dumps  # a JSON string literal is a valid TOML basic string
        lines = [
            f"# Written by an ad-hoc `irbench run --model ...` on {today.isoformat()}: the campaign it ran.",
            "# The same command again resumes it; so does `irbench run THIS_FILE --data DATA`.",
            f"name = {q(self.campaign_name())}",
            f"description = {q(f'ad-hoc run of {self.model} at {self.base_url}')}",
            f"runs = {self.runs}",
            "",
            "[corpus]",
            f"paths = [{q(str(self.prompts.resolve()))}]",
            "",
            f"[endpoints.{ENDPOINT_NAME}]",
            f"base_url = {q(self.base_url)}",
            f"wire_format = {q(self.wire_format)}",
        ]
        if self.api_key_env:
            lines.append(f"api_key_env = {q(self.api_key_env)}")
        lines += [
            "",
            f"[models.{q(self.model)}]",
            f"endpoint = {q(ENDPOINT_NAME)}",
            f"max_tokens = {self.max_tokens if self.max_tokens is not None else q('none')}",
            f"temperature = {self.temperature if self.temperature is not None else q('none')}",
            "",
            "[executor]",
            'kind = "local"',
            "",
        ]
        return "\n".join(lines)

    def write(self, data: Path, today: dt.date | None = None) -> tuple[Path, list[str]]:
        """Write ``DATA/campaigns/<name>.toml`` and return (its path, what changed against the copy
        already there: ``"runs = 3 -> runs = 4"`` lines). An unchanged campaign keeps its file."""
        self.check()
        folder = Path(data) / CAMPAIGNS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.campaign_name()}.toml"
        text = self.to_toml(today or dt.datetime.now(dt.timezone.utc).date())
        changes: list[str] = []
        if path.exists():
            changes = _changed_lines(path.read_text(encoding="utf-8"), text)
            if not changes:
                return path, []
        tmp = path.with_suffix(".toml.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        return path, changes


def _changed_lines(before: str, after: str) -> list[str]:
    """``old -> new`` for each setting line that differs (comments and blank lines ignored)."""
    def settings(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]

    old, new = settings(before), settings(after)
    if len(old) != len(new):
        return [f"{len(old)} setting lines -> {len(new)}"]
    return [f"{a} -> {b}" for a, b in zip(old, new) if a != b]


@dataclass(frozen=True)
class AdhocFlags:
    """The ad-hoc flags of ``irbench run`` as given (None = not given: ``AdhocRun``'s default)."""

    model: str | None = None
    base_url: str | None = None
    prompts: Path | None = None
    wire_format: str | None = None
    api_key_env: str | None = None
    runs: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    name: str | None = None

    def given(self) -> list[str]:
        """The flags given, as ``--flag`` names, in declaration order."""
        return ["--" + k.replace("_", "-") for k, v in asdict(self).items() if v is not None]


@dataclass(frozen=True)
class CampaignFile:
    """The campaign ``irbench run`` loads; ``changes``: how an ad-hoc re-run changed its file."""

    path: Path
    changes: tuple[str, ...] = ()


def campaign_file_for(campaign: Path | None, data: Path, flags: AdhocFlags) -> CampaignFile:
    """The campaign file ``irbench run`` should load: the given TOML, or the ad-hoc one written now.

    Raises ConfigError when both or neither are described, when an ad-hoc flag goes with a
    campaign file (it would be ignored), or when an ad-hoc flag is missing.
    """
    given = (("--model", flags.model), ("--base-url", flags.base_url), ("--prompts", flags.prompts))
    adhoc_given = [flag for flag, v in given if v]
    if campaign is not None:
        if adhoc_given:
            raise ConfigError(f"give a campaign file or {'/'.join(adhoc_given)}, not both")
        if flags.given():
            raise ConfigError(f"{', '.join(flags.given())} only go with an ad-hoc run (--model, --base-url, --prompts); "
                              f"with a campaign file, set them in {campaign}")
        return CampaignFile(campaign)
    if not adhoc_given:
        raise ConfigError("say what to run: a campaign file (irbench run examples/demo.toml --data data/), or "
                          "--model NAME --base-url URL --prompts DIR")
    missing = [f for f in ("--model", "--base-url", "--prompts") if f not in adhoc_given]
    if missing:
        raise ConfigError(f"an ad-hoc run needs --model, --base-url and --prompts; missing {', '.join(missing)}")
    path, changes = AdhocRun(**{k: v for k, v in asdict(flags).items() if v is not None}).write(data)
    return CampaignFile(path, tuple(changes))
