"""Campaign spec: a TOML file validated into frozen pydantic models.

Input: a ``campaign.toml`` path. Output: a ``CampaignSpec`` or a ``ConfigError`` whose
``problems`` carry ONE line per problem, each naming the file and the field path, e.g.
``demo.toml: models.sim-mild.endpoint: 'simx' is not a defined endpoint (defined: sim)``.

Layout of the file (unknown keys anywhere are errors, so typos never pass silently)::

    name = "demo"                 # slug: letters, digits, '.', '_', '-'
    panel = "demo"                # optional, defaults to name
    description = "..."
    runs = 3                      # runs per (prompt, model[, budget]) cell, >= 1
    budgets = [1500, 8000]        # optional; every run is crossed with every budget,
                                  # and a budget overrides the model's max_tokens
    instruction = "my.txt"        # optional custom template (default: built-in irbench-v1)
    prices = "prices.toml"        # optional shared price file (orchestrator.campaign.prices)
    max_cost_usd = 5.0            # optional spend cap of the campaign (workers.spend; per model too,
    max_total_tokens = 2000000    #   in [models.X] or [defaults]); a cost cap needs every price

    [corpus]                      # paths/manifest relative to this file's directory
    paths = ["prompts"]
    [endpoints.sim]
    base_url = "http://127.0.0.1:8765"
    wire_format = "openai"        # or "ollama"
    api_key_env = "SIM_API_KEY"   # the NAME of an env var, never the key itself
    [defaults]                    # any model field, applied to every model
    endpoint = "sim"
    [models.sim-mild]             # one table per model; the key is the model id sent to
    requests_per_minute = 600     # the provider unless `name = "..."` overrides it
    stream = true                 # optional: streamed answers, time to first token recorded
    max_response_bytes = 8388608  # bounds on one answer (workers.runtask.ResponseLimits):
    max_json_depth = 64           #   body size, JSON nesting, answer size read by the IR
    max_answer_chars = 1048576    #   extraction, IR nodes validated; any model field can
    max_ir_nodes = 2000           #   also go in [defaults]
    [retry]                       # fields of workers.runtask.RetryPolicy, e.g.
    max_retry_after_s = 120       #   longest Retry-After honoured; longer ends the run
    run_deadline_s = 3600         #   no retry wait may end past this (per run)
    [executor]
    kind = "local"                # or "celery"

Model ids (``name``, default the table key) may hold letters, digits and ``. _ : / @ + -`` only
(no whitespace, control characters or ``..`` segments); ``base_url`` must be http(s) with a
host, a port in 1-65535 and no credentials.

Models are declared as ``[models.<id>]`` tables (not ``[[models]]`` arrays) so every error
names the model in its field path. TOML has no null: write ``"none"`` for an optional number
(a timeout, ``max_tokens``, ``temperature``, a rate) to mean "no cap / not sent".
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.campaign.spec_checks import (
    ENV_NAME_RE, SLUG_RE, check_http_url, check_model_name, looks_like_key, problem_lines, scan_secrets, shown,
)
from orchestrator.campaign.prices import price_file_problems
from workers.errors import ConfigError
from workers.runtask import EndpointRef, ModelLimits, ResponseLimits, RetryPolicy, TimeoutPolicy, WireFormat
from workers.spend import SpendCap


DEFAULT_GLOBS = ("**/*.prompt.rtpl", "**/*.md", "**/*.txt")


def _none_word(value: Any) -> Any:
    """TOML has no null: accept the string ``"none"`` (any case) as ``None``."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    return value


PosFloatOrNone = Annotated[Annotated[float, Field(gt=0)] | None, BeforeValidator(_none_word)]
PosIntOrNone = Annotated[Annotated[int, Field(ge=1)] | None, BeforeValidator(_none_word)]
NonNegFloatOrNone = Annotated[Annotated[float, Field(ge=0)] | None, BeforeValidator(_none_word)]
TemperatureOrNone = Annotated[Annotated[float, Field(ge=0, le=2)] | None, BeforeValidator(_none_word)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CorpusSpec(_Strict):
    """Where the prompts come from. Relative paths resolve against the campaign file's directory."""

    paths: list[Path] = Field(min_length=1)
    globs: list[str] = Field(default_factory=lambda: list(DEFAULT_GLOBS), min_length=1)
    manifest: Path | None = None
    license_allow: list[str] | None = None
    max_file_bytes: int = Field(default=1024 * 1024, ge=1)


class EndpointSpec(_Strict):
    base_url: str
    wire_format: WireFormat = "openai"
    api_key_env: str | None = None
    # the endpoint's default prices, US dollars per million tokens (orchestrator.campaign.prices)
    input_usd_per_mtok: NonNegFloatOrNone = None
    output_usd_per_mtok: NonNegFloatOrNone = None

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_http_url(v)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if looks_like_key(v):
            raise ValueError(
                "this looks like an API key itself; never put a key in the campaign file: export it "
                "in an environment variable and give that variable's NAME here (e.g. api_key_env = \"OPENAI_API_KEY\")"
            )
        if not ENV_NAME_RE.match(v):
            raise ValueError(f"{v!r} is not an environment variable name (letters, digits, '_'; e.g. \"OPENAI_API_KEY\")")
        return v

    def to_ref(self, name: str) -> EndpointRef:
        return EndpointRef(name=name, base_url=self.base_url, wire_format=self.wire_format, api_key_env=self.api_key_env)


class ModelDefaults(_Strict):
    """Any model field, applied to every model that does not set it itself."""

    endpoint: str | None = None
    requests_per_minute: PosFloatOrNone = None
    tokens_per_minute: PosFloatOrNone = None
    max_concurrency: PosIntOrNone = 4
    connect_timeout_s: PosFloatOrNone = 10.0
    read_timeout_s: PosFloatOrNone = 300.0
    total_timeout_s: PosFloatOrNone = 600.0
    max_tokens: PosIntOrNone = None
    temperature: TemperatureOrNone = 0.0
    reasoning: bool | None = None
    structured_output: bool = False
    stream: bool = False  # ask for a streamed answer: the record then has the time to first token
    options: dict[str, Any] = Field(default_factory=dict)
    # bounds on one answer (workers.runtask.ResponseLimits documents each)
    max_response_bytes: int = Field(default=ResponseLimits().max_response_bytes, ge=1024)
    max_json_depth: int = Field(default=ResponseLimits().max_json_depth, ge=4, le=512)
    max_answer_chars: int = Field(default=ResponseLimits().max_answer_chars, ge=1024)
    max_ir_nodes: int = Field(default=ResponseLimits().max_ir_nodes, ge=1)
    # prices, US dollars per million prompt / completion tokens (orchestrator.campaign.prices)
    input_usd_per_mtok: NonNegFloatOrNone = None
    output_usd_per_mtok: NonNegFloatOrNone = None
    # this model's spend cap (workers.spend): its calls stop before passing either
    max_cost_usd: PosFloatOrNone = None
    max_total_tokens: PosIntOrNone = None

    def spend_cap(self) -> SpendCap:
        return SpendCap(max_total_tokens=self.max_total_tokens, max_cost_usd=self.max_cost_usd)


NONE_ABLE = frozenset(
    {"requests_per_minute", "tokens_per_minute", "max_concurrency", "connect_timeout_s", "read_timeout_s",
     "total_timeout_s", "max_tokens", "temperature", "input_usd_per_mtok", "output_usd_per_mtok",
     "max_cost_usd", "max_total_tokens"}
)


class ModelSpec(ModelDefaults):
    """One model of the panel. ``name`` is the model id sent to the provider."""

    name: str = Field(min_length=1)
    endpoint: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_model_name(v)

    def to_limits(self) -> ModelLimits:
        return ModelLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            max_concurrency=self.max_concurrency,
        )

    def to_response_limits(self) -> ResponseLimits:
        return ResponseLimits(
            max_response_bytes=self.max_response_bytes,
            max_json_depth=self.max_json_depth,
            max_answer_chars=self.max_answer_chars,
            max_ir_nodes=self.max_ir_nodes,
        )

    def to_timeouts(self) -> TimeoutPolicy:
        return TimeoutPolicy(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            total_timeout_s=self.total_timeout_s,
        )


class RetrySpec(RetryPolicy):
    """``RetryPolicy`` that rejects unknown keys; ``to_policy()`` returns the plain contract type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_policy(self) -> RetryPolicy:
        return RetryPolicy(**self.model_dump())


class ExecutorSpec(_Strict):
    kind: Literal["local", "celery"] = "local"
    concurrency: int = Field(default=4, ge=1)
    broker: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class CampaignSpec(_Strict):
    name: str
    panel: str = ""
    description: str = ""
    corpus: CorpusSpec
    endpoints: dict[str, EndpointSpec] = Field(min_length=1)
    defaults: ModelDefaults = ModelDefaults()
    models: dict[str, ModelSpec] = Field(min_length=1)
    runs: int = Field(default=1, ge=1)
    budgets: list[Annotated[int, Field(ge=1)]] | None = None
    instruction: Path | None = None
    prices: Path | None = None
    max_cost_usd: PosFloatOrNone = None  # the campaign's spend cap (workers.spend)
    max_total_tokens: PosIntOrNone = None
    retry: RetrySpec = RetrySpec()
    executor: ExecutorSpec = ExecutorSpec()
    base_dir: Path = Field(default=Path("."), description="directory of the campaign file; relative paths resolve here")

    @field_validator("name", "panel")
    @classmethod
    def _slug(cls, v: str) -> str:
        if v and not SLUG_RE.match(v):
            raise ValueError(f"{v!r} is not slug-safe; use letters, digits, '.', '_' or '-' (e.g. 'demo-2024')")
        return v

    @field_validator("endpoints")
    @classmethod
    def _endpoint_keys(cls, v: dict[str, EndpointSpec]) -> dict[str, EndpointSpec]:
        for key in v:
            if not SLUG_RE.match(key):
                raise ValueError(f"endpoint name {shown(key)} is not slug-safe; use letters, digits, '.', '_' or '-'")
        return v

    @field_validator("budgets")
    @classmethod
    def _unique_budgets(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("empty list; omit `budgets` to use each model's max_tokens")
            dup = sorted({b for b in v if v.count(b) > 1})
            if dup:
                raise ValueError(f"duplicate budget(s) {dup}; list each budget once")
        return v

    @model_validator(mode="before")
    @classmethod
    def _panel_default(cls, data: Any) -> Any:
        # an invalid name is reported once, under `name`, not again under the panel it would fill
        if isinstance(data, dict) and not data.get("panel") and isinstance(data.get("name"), str) and SLUG_RE.match(data["name"]):
            data = {**data, "panel": data["name"]}
        return data

    def spend_cap(self) -> SpendCap:
        return SpendCap(max_total_tokens=self.max_total_tokens, max_cost_usd=self.max_cost_usd)

    def endpoint_ref(self, model: ModelSpec) -> EndpointRef:
        return self.endpoints[model.endpoint].to_ref(model.endpoint)

    def with_base_url(self, endpoint: str, base_url: str) -> "CampaignSpec":
        """A copy with one endpoint's base_url replaced (e.g. the demo's real simulator port)."""
        if endpoint not in self.endpoints:
            raise ConfigError(f"endpoint {endpoint!r} is not defined (defined: {', '.join(self.endpoints)})")
        eps = dict(self.endpoints)
        eps[endpoint] = EndpointSpec.model_validate({**eps[endpoint].model_dump(), "base_url": base_url})
        return self.model_copy(update={"endpoints": eps})


# --------------------------------------------------------------------------- loading


def _merge_models(fname: str, raw: dict[str, Any], problems: list[str]) -> None:
    """Apply ``[defaults]`` to each ``[models.<id>]`` table in place (before validation)."""
    defaults_raw = raw.get("defaults", {})
    good_defaults: dict[str, Any] = {}
    if isinstance(defaults_raw, dict):
        try:
            ModelDefaults.model_validate(defaults_raw)
            good_defaults = dict(defaults_raw)
        except ValidationError as err:
            # Report defaults' own errors once (under `defaults.`) and apply only the good fields.
            bad = {e["loc"][0] for e in err.errors() if e["loc"]}
            good_defaults = {k: v for k, v in defaults_raw.items() if k not in bad}
    models = raw.get("models")
    if models is None:
        return
    if isinstance(models, list):
        problems.append(f"{fname}: models: declare models as [models.<id>] tables, not [[models]] arrays")
        raw.pop("models")
        return
    if not isinstance(models, dict):
        return
    endpoints = _table(raw, "endpoints")
    for key, table in models.items():
        if not isinstance(table, dict):
            continue
        merged = {**good_defaults, **table}
        if isinstance(table.get("options", {}), dict):
            merged["options"] = {**good_defaults.get("options", {}), **table.get("options", {})}
        merged.setdefault("name", key)
        if "endpoint" not in merged and len(endpoints) == 1:
            merged["endpoint"] = next(iter(endpoints))  # one endpoint: nothing to choose
        models[key] = merged


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    """``raw[key]`` when it is a table, else an empty one."""
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _cross_check(fname: str, raw: dict[str, Any]) -> list[str]:
    """Checks across fields, on the raw (merged) document so they run even when a field is invalid."""
    problems: list[str] = []
    endpoints = _table(raw, "endpoints")
    defined = ", ".join(endpoints) or "none; add an [endpoints.<name>] table"
    models = _table(raw, "models")
    seen: dict[str, str] = {}
    for key, m in models.items():
        if not isinstance(m, dict):
            continue
        ep = m.get("endpoint")
        if isinstance(ep, str) and ep not in endpoints:
            problems.append(f"{fname}: models.{key}.endpoint: {ep!r} is not a defined endpoint (defined: {defined})")
        name = m.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(
                    f"{fname}: models.{key}.name: duplicate model {name!r} (also models.{seen[name]}); "
                    "each model id may appear once per campaign"
                )
            seen.setdefault(name, key)
        ct, tt = m.get("connect_timeout_s"), m.get("total_timeout_s")
        if isinstance(ct, (int, float)) and isinstance(tt, (int, float)) and 0 < tt < ct:
            problems.append(f"{fname}: models.{key}.connect_timeout_s: {ct} exceeds total_timeout_s {tt}; lower it or raise total_timeout_s")
    defaults = _table(raw, "defaults")
    dep = defaults.get("endpoint")
    if isinstance(dep, str) and dep not in endpoints:
        problems.append(f"{fname}: defaults.endpoint: {dep!r} is not a defined endpoint (defined: {defined})")
    instr = raw.get("instruction")
    if isinstance(instr, str) and not Path(instr).is_file():
        problems.append(f"{fname}: instruction: template file {instr!r} does not exist")
    corpus = _table(raw, "corpus")
    paths = corpus.get("paths")
    for i, p in enumerate(paths if isinstance(paths, list) else []):
        if isinstance(p, str) and not Path(p).exists():
            problems.append(f"{fname}: corpus.paths[{i}]: {p!r} does not exist")
    man = corpus.get("manifest")
    if isinstance(man, str) and not Path(man).is_file():
        problems.append(f"{fname}: corpus.manifest: {man!r} does not exist")
    return problems


def _resolve(base: Path, p: Any) -> Any:
    if isinstance(p, str):
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else (base / q))
    return p


def load_campaign(path: Path) -> CampaignSpec:
    """Read and validate a campaign TOML file; raise ``ConfigError`` listing every problem."""
    path = Path(path)
    fname = path.name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read campaign file ({exc.strerror or exc})") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{fname}: not valid UTF-8; save the campaign file as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{fname}: TOML syntax error: {exc}") from None

    problems: list[str] = []
    scan_secrets(fname, raw, (), problems)
    base = path.resolve().parent
    if "base_dir" in raw:
        problems.append(f"{fname}: base_dir: unknown key (it is always the campaign file's directory)")
        raw.pop("base_dir")
    raw["base_dir"] = str(base)
    corpus = raw.get("corpus")
    if isinstance(corpus, dict):
        if isinstance(corpus.get("paths"), list):
            corpus["paths"] = [_resolve(base, p) for p in corpus["paths"]]
        if "manifest" in corpus:
            corpus["manifest"] = _resolve(base, corpus["manifest"])
    if "instruction" in raw:
        raw["instruction"] = _resolve(base, raw["instruction"])
    if "prices" in raw:
        raw["prices"] = _resolve(base, raw["prices"])
    _merge_models(fname, raw, problems)
    problems += _cross_check(fname, raw)

    spec = None
    try:
        spec = CampaignSpec.model_validate(raw)
    except ValidationError as err:
        problems += problem_lines(fname, err, CampaignSpec, NONE_ABLE)
    if spec is not None:
        problems += price_file_problems(fname, spec.prices)
    if problems or spec is None:
        raise ConfigError(f"{fname}: invalid campaign spec ({len(problems)} problem(s))", problems)
    return spec
