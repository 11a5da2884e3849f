"""``irbench waves``: did a model change between two measurement waves, or is it just noisy?

Reads the store's runs of two waves of each campaign (default: the latest wave against the one
before), compares them per model (``analysis.waves.compare_waves``: a permutation test of the
wave labels within each prompt, Benjamini–Hochberg across models) and prints a table, or the
comparison as JSON with ``--json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.data_option import store_root
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.waves.options import WaveOptions
from analysis.waves.pairs import OneWaveError, WavePair, pair_of
from analysis.waves.served import served_text
from orchestrator.cli.user_errors import fail
from workers.errors import ConfigError, IrbenchError

if TYPE_CHECKING:
    from analysis.waves.compare import CampaignWaves

_DEFAULTS = WaveOptions()  # the flags' defaults are the options object's, defined once there


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
        try:
            pairs.append(pair_of(name, held[name], from_wave, to_wave))
        except OneWaveError:
            if campaign is not None:
                raise
            # campaigns measured once have nothing to compare
    if not pairs:
        raise ConfigError("no campaign in the store has two waves: measure one again with irbench run CAMPAIGN --new-wave")
    return pairs


def _availability(m) -> str:
    a = m.availability
    if a is None or (a.from_status is None and a.to_status is None):
        return "—"
    text = f"{a.from_status or '?'} -> {a.to_status or '?'}"
    return f"[bold red]{text}[/]" if a.changed else text


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

        served = escape(served_text(m.served))  # the endpoint's text: never read as markup
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
    from analysis.waves.compare import WaveComparison
    from analysis.waves.pairs import compare_pair
    from pydantic import ValidationError

    try:
        try:
            options = WaveOptions(alpha=alpha, permutations=permutations, seed=seed)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(f"--{first['loc'][0]}: {first['msg']}") from None
        results: list[CampaignWaves] = []
        for pair in choose_pairs(data, campaign, from_wave, to_wave):
            compared = compare_pair(data, pair, options)
            if compared is not None:
                results.append(compared)
    except (IrbenchError, AnalysisError) as exc:
        fail(exc)
    if as_json:
        print(WaveComparison(tuple(results)).to_json())
        return
    out = Console(width=None if sys.stdout.isatty() else 200)
    for c in results:
        out.print(_table(c))

