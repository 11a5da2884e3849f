"""``irbench waves``: did a model change between two measurement waves, or is it just noisy?

Reads the store's runs of two waves of each campaign (default: the latest wave against the one
before), compares them per model (``analysis.waves.compare_waves``: a permutation test of the
wave labels within each prompt, Benjamini–Hochberg across models) and prints a table, or the
comparison as JSON with ``--json``.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.data_option import store_root
from rich.console import Console
from rich.table import Table

from analysis.waves.options import WaveOptions
from orchestrator.cli.user_errors import fail
from workers.errors import ConfigError, IrbenchError

if TYPE_CHECKING:
    from analysis.waves.compare import CampaignWaves

_DEFAULTS = WaveOptions()  # the flags' defaults are the options object's, defined once there
_COLUMNS = ("campaign", "model", "prompt_sha256", "run_id", "parse_outcome", "ir_json", "node_ids", "wave",
            "panel", "budget_max_tokens", "outcome", "served_model", "system_fingerprint")


@dataclass(frozen=True)
class WavePair:
    """The two waves of one campaign to compare; ``to_started_at`` and ``to_ends_at`` (the start
    of the wave after ``to_wave``, None when it is the latest) bound the availability windows."""

    campaign: str
    from_wave: int
    to_wave: int
    to_started_at: dt.datetime | None = None
    to_ends_at: dt.datetime | None = None


def choose_pairs(data: Path, campaign: str | None, from_wave: int | None, to_wave: int | None) -> list[WavePair]:
    """The wave pair of each campaign (``campaign`` alone when given); ConfigError for a
    campaign with fewer than two waves, or a wave it does not hold."""
    from storage.waves import waves_of

    held = waves_of(data, [campaign] if campaign else None)
    if campaign is not None and not held.get(campaign):
        raise ConfigError(f"the store at {data} holds no runs of campaign {campaign!r}")
    if not held:
        raise ConfigError(f"the store at {data} holds no runs (irbench run CAMPAIGN --data {data} first)")
    pairs = []
    for name in sorted(held):
        numbers = sorted(w.wave for w in held[name])
        if len(numbers) < 2:
            if campaign is None:
                continue  # campaigns measured once have nothing to compare
            raise ConfigError(f"campaign {name!r} has one wave: measure another with irbench run CAMPAIGN --new-wave")
        to = to_wave if to_wave is not None else numbers[-1]
        frm = from_wave if from_wave is not None else max(w for w in numbers if w < to) if to > numbers[0] else None
        for w in (frm, to):
            if w not in numbers:
                raise ConfigError(f"campaign {name!r} has waves {', '.join(map(str, numbers))}, not {w}")
        assert frm is not None
        starts = {w.wave: w.started_at for w in held[name]}
        later = [w for w in numbers if w > to]
        pairs.append(WavePair(name, frm, to, starts.get(to), starts.get(later[0]) if later else None))
    if not pairs:
        raise ConfigError("no campaign in the store has two waves: measure one again with irbench run CAMPAIGN --new-wave")
    return pairs


def _check_complete(table, pair: WavePair) -> None:
    """Refuse a comparison where one wave holds fewer runs of a model than the other: an
    unfinished wave would read as a change."""
    import pyarrow.compute as pc

    counts: dict[tuple[str, int], int] = {}
    for model, wave in zip(table["model"].to_pylist(), table["wave"].to_pylist()):
        counts[(model, wave)] = counts.get((model, wave), 0) + 1
    for model in sorted(set(pc.unique(table["model"]).to_pylist())):
        a, b = counts.get((model, pair.from_wave), 0), counts.get((model, pair.to_wave), 0)
        if a != b:
            raise ConfigError(f"campaign {pair.campaign!r}, model {model}: wave {pair.from_wave} holds {a} runs and "
                              f"wave {pair.to_wave} {b}; finish the wave with irbench run CAMPAIGN first")


def _availability(m) -> str:
    a = m.availability
    if a is None or (a.from_status is None and a.to_status is None):
        return "—"
    text = f"{a.from_status or '?'} -> {a.to_status or '?'}"
    return f"[bold red]{text}[/]" if a.changed else text


def _with_availability(data: Path, pair: WavePair, comparison):
    """``comparison`` with each model's availability status around the two waves attached."""
    from analysis.waves.availability import availability_changes
    from storage.availability import AvailabilityStore

    models = sorted({m.model for c in comparison.campaigns for m in c.models})
    rows = AvailabilityStore(data, fsync=False).read(models=models)
    return comparison.with_availability(pair.campaign, availability_changes(
        rows, models, pair.to_started_at, pair.to_ends_at))


def _table(c: CampaignWaves) -> Table:
    t = Table(title=f"{c.campaign}: wave {c.from_wave} -> wave {c.to_wave} (changed: BH q <= {c.alpha:g})",
              title_justify="left")
    for col in ("model", "changed", "p", "q", "Jaccard change [interval]", f"wave {c.from_wave} (rank)",
                f"wave {c.to_wave} (rank)", "served identity", "retired (410)", "availability"):
        t.add_column(col)
    for m in c.models:
        iv = m.test.effect_interval
        effect = "—" if m.test.effect is None else (
            f"{m.test.effect:+.3f}" + ("" if iv is None else f" [{iv.low:+.3f}, {iv.high:+.3f}]"))

        def side(s) -> str:
            return "—" if s.jaccard is None else f"{s.jaccard.point:.3f} ({s.rank})"

        served = {None: "unknown", True: "changed", False: "same"}[m.served_identity_changed]
        retired = f"{m.from_side.runs_retired} -> {m.to_side.runs_retired}" + (
            " [bold red]retired[/]" if m.newly_retired else "")
        t.add_row(m.model, "[bold red]yes[/]" if m.changed else "no",
                  "—" if m.test.p_value is None else f"{m.test.p_value:.3g}",
                  "—" if m.q_value is None else f"{m.q_value:.3g}", effect, side(m.from_side), side(m.to_side), served,
                  retired, _availability(m))
    return t


def waves_command(
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root.")] = Path("data"),
    campaign: Annotated[Optional[str], typer.Option(help="Only this campaign (by name).")] = None,
    from_wave: Annotated[Optional[int], typer.Option("--from", min=1, help="Earlier wave (default: the one before --to).")] = None,
    to_wave: Annotated[Optional[int], typer.Option("--to", min=1, help="Later wave (default: the latest).")] = None,
    alpha: Annotated[float, typer.Option(help="Flag a model as changed at BH q <= alpha (0 < alpha < 1).")] = _DEFAULTS.alpha,
    permutations: Annotated[int, typer.Option(help="Wave-label permutations per model (at least 19).")] = _DEFAULTS.permutations,
    seed: Annotated[int, typer.Option(help="Seed of the permutations and bootstraps.")] = _DEFAULTS.seed,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Compare two measurement waves per model: did the model change, or is it noise?

    Example: irbench waves --data data/ --campaign demo --from 1 --to 2
    """
    from analysis.errors import AnalysisError
    from analysis.waves.compare import WaveComparison, compare_waves
    from pydantic import ValidationError

    from storage.runs import RunStore

    try:
        try:
            options = WaveOptions(alpha=alpha, permutations=permutations, seed=seed)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(f"--{first['loc'][0]}: {first['msg']}") from None
        store = RunStore(data, fsync=False)
        results: list[CampaignWaves] = []
        for pair in choose_pairs(data, campaign, from_wave, to_wave):
            table = store.read_table(campaigns=[pair.campaign], waves=[pair.from_wave, pair.to_wave],
                                     columns=[c for c in _COLUMNS if c in store.dataset.spec.schema.names])
            _check_complete(table, pair)
            compared = compare_waves(table, pair.from_wave, pair.to_wave, options)
            results.extend(_with_availability(data, pair, compared).campaigns)
    except (IrbenchError, AnalysisError) as exc:
        fail(exc)
    if as_json:
        print(WaveComparison(tuple(results)).to_json())
        return
    out = Console(width=None if sys.stdout.isatty() else 200)
    for c in results:
        out.print(_table(c))

