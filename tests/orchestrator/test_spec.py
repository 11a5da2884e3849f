"""Campaign spec: good specs load with the documented defaults; bad specs fail with one clear line each."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.campaign.spec import CampaignSpec, load_campaign
from workers.errors import ConfigError
from workers.runtask import EndpointRef, ModelLimits, RetryPolicy, TimeoutPolicy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GOOD = """
name = "camp"
runs = 2
[corpus]
paths = ["prompts"]
[endpoints.sim]
base_url = "http://127.0.0.1:8765/"
wire_format = "openai"
api_key_env = "SIM_API_KEY"
[endpoints.local]
base_url = "http://127.0.0.1:11434"
wire_format = "ollama"
[defaults]
endpoint = "sim"
read_timeout_s = 45
options = {seed_hint = 1}
[models.sim-mild]
requests_per_minute = 120
max_tokens = 4000
[models.llama]
name = "llama3.2:3b"
endpoint = "local"
total_timeout_s = "none"
temperature = "none"
reasoning = true
options = {num_ctx = 8192}
"""


def write(tmp_path: Path, body: str, name: str = "camp.toml") -> Path:
    (tmp_path / "prompts").mkdir(exist_ok=True)
    p = tmp_path / name
    p.write_text(textwrap.dedent(body), encoding="utf-8")
    return p


def problems_of(tmp_path: Path, body: str) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_campaign(write(tmp_path, body))
    return ei.value.problems


def test_good_spec_defaults_and_converters(tmp_path: Path) -> None:
    spec = load_campaign(write(tmp_path, GOOD))
    assert spec.panel == "camp" and spec.runs == 2 and spec.budgets is None
    assert spec.corpus.paths == [tmp_path.resolve() / "prompts"]
    assert spec.corpus.globs == ["**/*.prompt.rtpl", "**/*.md", "**/*.txt"]
    assert spec.corpus.max_file_bytes == 1024 * 1024
    assert list(spec.models) == ["sim-mild", "llama"]
    mild, llama = spec.models["sim-mild"], spec.models["llama"]
    assert mild.name == "sim-mild" and mild.endpoint == "sim" and mild.read_timeout_s == 45
    assert mild.options == {"seed_hint": 1}
    assert llama.name == "llama3.2:3b" and llama.options == {"seed_hint": 1, "num_ctx": 8192}
    assert llama.total_timeout_s is None and llama.temperature is None and llama.reasoning is True
    assert mild.to_limits() == ModelLimits(requests_per_minute=120, tokens_per_minute=None, max_concurrency=4)
    assert mild.to_timeouts() == TimeoutPolicy(connect_timeout_s=10.0, read_timeout_s=45.0, total_timeout_s=600.0)
    assert llama.to_timeouts().total_timeout_s is None
    assert spec.endpoint_ref(mild) == EndpointRef(
        name="sim", base_url="http://127.0.0.1:8765", wire_format="openai", api_key_env="SIM_API_KEY"
    )
    assert spec.endpoints["local"].to_ref("local").wire_format == "ollama"
    assert spec.retry.to_policy() == RetryPolicy()
    assert spec.executor.kind == "local"
    moved = spec.with_base_url("sim", "http://127.0.0.1:9999")
    assert moved.endpoints["sim"].base_url == "http://127.0.0.1:9999" and spec.endpoints["sim"].base_url.endswith("8765")


def test_demo_toml_loads() -> None:
    spec = load_campaign(EXAMPLES / "demo.toml")
    assert isinstance(spec, CampaignSpec) and spec.name == "demo" and spec.runs == 3
    assert list(spec.models) == ["sim-steady", "sim-mild", "sim-medium", "sim-shaky", "sim-chaotic"]
    assert {m.endpoint for m in spec.models.values()} == {"sim"}
    assert spec.endpoints["sim"].wire_format == "openai"
    assert spec.corpus.paths == [(EXAMPLES / "prompts").resolve()]
    assert all(m.max_tokens is None and (m.max_concurrency or 0) <= 8 for m in spec.models.values())


@pytest.mark.parametrize(
    "body, expected",
    [
        # missing required field
        ('[corpus]\npaths=["prompts"]\n[endpoints.sim]\nbase_url="http://x:1"\n[models.m]\n',
         "camp.toml: name: required field is missing"),
        # wrong type
        (GOOD.replace("runs = 2", 'runs = "two"'), "camp.toml: runs: Input should be a valid integer"),
        # unknown key with a did-you-mean hint
        (GOOD.replace("requests_per_minute = 120", "request_per_minute = 120"),
         "camp.toml: models.sim-mild.request_per_minute: unknown key; did you mean 'requests_per_minute'?"),
        (GOOD + "\n[retry]\nmax_attempt = 2\n", "camp.toml: retry.max_attempt: unknown key; did you mean 'max_attempts'?"),
        (GOOD.replace('name = "camp"', 'name = "camp"\nrunz = 3'), "camp.toml: runz: unknown key; did you mean 'runs'?"),
        # undefined endpoint
        (GOOD.replace('endpoint = "local"', 'endpoint = "simx"'),
         "camp.toml: models.llama.endpoint: 'simx' is not a defined endpoint (defined: sim, local)"),
        # negative timeout
        (GOOD.replace("read_timeout_s = 45", "read_timeout_s = -5"), "camp.toml: defaults.read_timeout_s: Input should be greater than 0"),
        # bad wire format
        (GOOD.replace('wire_format = "ollama"', 'wire_format = "olama"'),
         "camp.toml: endpoints.local.wire_format: Input should be 'openai' or 'ollama'"),
        # duplicate model (two tables, one model id)
        (GOOD + '\n[models.again]\nname = "sim-mild"\n',
         "camp.toml: models.again.name: duplicate model 'sim-mild' (also models.sim-mild)"),
        # api key literal: as a field, and as an env var "name"
        (GOOD.replace('api_key_env = "SIM_API_KEY"', 'api_key = "abc"'), "camp.toml: endpoints.sim.api_key: never put a secret"),
        (GOOD.replace('api_key_env = "SIM_API_KEY"', 'api_key_env = "sk-proj-abcdefghijklmnop1234567890"'),
         "camp.toml: endpoints.sim.api_key_env: this looks like an API key itself"),
        (GOOD.replace("options = {num_ctx = 8192}", 'options = {auth = "sk-abcdefghijklmnopqrstu123"}'),
         "camp.toml: models.llama.options.auth: value looks like an API key"),
        # others
        (GOOD.replace('name = "camp"', 'name = "my camp!"'), "camp.toml: name: 'my camp!' is not slug-safe"),
        (GOOD.replace("runs = 2", "runs = 0"), "camp.toml: runs: Input should be greater than or equal to 1"),
        (GOOD.replace("runs = 2", "runs = 2\nbudgets = [1500, 1500]"), "camp.toml: budgets: duplicate budget(s) [1500]"),
        (GOOD.replace('paths = ["prompts"]', 'paths = ["nope"]'), "camp.toml: corpus.paths[0]: "),
        (GOOD.replace('base_url = "http://127.0.0.1:11434"', 'base_url = "127.0.0.1:11434"'),
         "camp.toml: endpoints.local.base_url: '127.0.0.1:11434' is not an http(s) URL"),
        (GOOD + '\n[executor]\nkind = "k8s"\n', "camp.toml: executor.kind: Input should be 'local' or 'celery'"),
        (GOOD.replace("[models.sim-mild]", "[[models]]"), "camp.toml: models: declare models as [models.<id>] tables"),
        (GOOD.replace("options = {num_ctx = 8192}", "options = 3"), "camp.toml: models.llama.options: Input should be a valid dictionary"),
        (GOOD.replace("max_tokens = 4000", 'max_tokens = "lots"'),
         'camp.toml: models.sim-mild.max_tokens: Input should be a valid integer'),
    ],
)
def test_bad_specs_one_clear_line(tmp_path: Path, body: str, expected: str) -> None:
    problems = problems_of(tmp_path, body)
    assert any(p.startswith(expected) for p in problems), problems
    assert all(p.startswith("camp.toml: ") and "\n" not in p for p in problems), problems


def test_several_problems_reported_together(tmp_path: Path) -> None:
    body = GOOD.replace('endpoint = "local"', 'endpoint = "nowhere"').replace("runs = 2", "runs = -1").replace(
        "max_tokens = 4000", "max_tokens = 4000\ncolour = 'red'"
    )
    problems = problems_of(tmp_path, body)
    assert len(problems) == 3, problems
    with pytest.raises(ConfigError) as ei:
        load_campaign(write(tmp_path, body))
    assert str(ei.value).count("\n  - ") == 3


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"camp\.toml: TOML syntax error: .*line 3"):
        load_campaign(write(tmp_path, 'name = "x"\nruns = 1\nbroken = = 2\n[corpus]\n'))
    # a model table declared twice is a TOML error, reported with its line too
    with pytest.raises(ConfigError, match=r"camp\.toml: TOML syntax error: .*line"):
        load_campaign(write(tmp_path, GOOD + "\n[models.llama]\nmax_tokens = 1\n"))


def test_missing_file_and_single_endpoint_default(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read campaign file"):
        load_campaign(tmp_path / "absent.toml")
    spec = load_campaign(write(tmp_path, 'name="a"\n[corpus]\npaths=["prompts"]\n[endpoints.e]\nbase_url="http://h:1"\n[models.m]\n'))
    assert spec.models["m"].endpoint == "e" and spec.models["m"].name == "m"
