"""The report's "Over time" section: each campaign measured in two or more waves, per model.

Unlike the other sections, which read the analysis outputs of one wave, this one compares the
stored runs of consecutive waves (``analysis.waves.compare_waves``, the test of ``irbench waves``
with its defaults, alpha included), so it needs the dataset (``--data``). A model's Jaccard and
rank in a wave are those of the comparison that wave belongs to (the first wave's from its
comparison with the second); a revision is flagged where a comparison finds ``changed``; a
retirement is a wave that met 410s after one that met none. Campaigns measured once contribute
nothing, and a store with no campaign of two waves has no section at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from analysis.report.doc import Block, Cell, Figure, Heading, Note, Paragraph, Table
from analysis.report.plots import OKABE_ITO, PlotStyle, _fontsize, _new_figure, _png
from analysis.report.tables import fmt_interval, fmt_num, fmt_p
from analysis.waves.compare import CampaignWaves, WaveSide, compare_waves
from analysis.waves.options import WaveOptions
from analysis.waves.pairs import WAVE_COLUMNS
from analysis.waves.served import served_text

__all__ = ["CampaignOverTime", "load_over_time", "over_time_blocks", "wave_sides"]

@dataclass(frozen=True)
class CampaignOverTime:
    """One campaign's waves (two or more, ascending) and the comparisons of consecutive ones."""

    campaign: str
    waves: tuple[int, ...]
    comparisons: tuple[CampaignWaves, ...]

    @property
    def models(self) -> list[str]:
        return sorted({m.model for c in self.comparisons for m in c.models})


def wave_sides(c: CampaignOverTime) -> dict[str, dict[int, WaveSide]]:
    """model -> wave -> its side (Jaccard interval, rank, run counts)."""
    out: dict[str, dict[int, WaveSide]] = {}
    for k, comp in enumerate(c.comparisons):
        for m in comp.models:
            sides = out.setdefault(m.model, {})
            if k == 0:
                sides[m.from_side.wave] = m.from_side
            sides[m.to_side.wave] = m.to_side
    return out


def load_over_time(data_dir: Path | None, options: WaveOptions | None = None) -> list[CampaignOverTime]:
    """Every campaign of the store at ``data_dir`` with two or more waves, compared wave to wave."""
    if data_dir is None or not (Path(data_dir) / "runs").is_dir():
        return []
    from storage.runs import RunStore
    from storage.waves import waves_of

    options = options or WaveOptions()
    store = RunStore(Path(data_dir), fsync=False)
    columns = [c for c in WAVE_COLUMNS if c in store.dataset.spec.schema.names]
    out = []
    for campaign, held in sorted(waves_of(Path(data_dir)).items()):
        numbers = tuple(sorted(w.wave for w in held))
        if len(numbers) < 2:
            continue
        table = store.read_table(campaigns=[campaign], waves=list(numbers), columns=columns)
        comps: list[CampaignWaves] = []
        for a, b in zip(numbers, numbers[1:]):
            comps.extend(compare_waves(table, a, b, options).campaigns)
        if comps:
            out.append(CampaignOverTime(campaign, numbers, tuple(comps)))
    return out


def jaccard_by_wave_plot(c: CampaignOverTime, style: PlotStyle = PlotStyle()) -> Figure | None:
    """One line per model: its mean Jaccard in each wave with the interval as an error bar."""
    sides = wave_sides(c)
    fig = _new_figure(style, 3.6)
    ax = fig.subplots()
    drawn = 0
    for i, model in enumerate(sorted(sides)):
        points = [(w, s.jaccard) for w, s in sorted(sides[model].items()) if s.jaccard is not None]
        if not points:
            continue
        xs = [w + (i - len(sides) / 2) * 0.03 for w, _ in points]  # a small dodge keeps bars apart
        ys = [iv.point for _, iv in points]
        err = [[iv.point - iv.low for _, iv in points], [iv.high - iv.point for _, iv in points]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=model,
                    color=OKABE_ITO[i % len(OKABE_ITO)])
        drawn += 1
    if not drawn:
        return None
    ax.set_xlabel("wave")
    ax.set_ylabel("mean node-set Jaccard")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
              fontsize=style.font_size_pt - 2)
    _fontsize(fig, style)
    name = "over-time-" + re.sub(r"[^A-Za-z0-9_-]+", "_", c.campaign)
    caption = (f"{c.campaign}: each model's mean Jaccard per wave with its bootstrap interval; a line "
               "falling beyond its interval is what the revision test below weighs.")
    return Figure(name, _png(fig, style), caption, f"Jaccard by wave, {c.campaign}")


def _ranks_table(c: CampaignOverTime) -> Table:
    sides = wave_sides(c)
    rows = []
    for model in sorted(sides):
        cells = [Cell(model, model)]
        for w in c.waves:
            s = sides[model].get(w)
            if s is None or s.jaccard is None:
                cells.append(Cell("—"))
                continue
            iv = s.jaccard
            cells.append(Cell(f"{fmt_num(iv.point)} {fmt_interval(iv.low, iv.high)} (rank {s.rank})",
                              s.rank))
        rows.append(tuple(cells))
    return Table(("model", *(f"wave {w}" for w in c.waves)), tuple(rows),
                 table_id=f"over-time-ranks-{c.campaign}",
                 caption="Mean Jaccard [interval] and rank (1 = most stable) in each wave.")


def _revisions_table(c: CampaignOverTime) -> Table:
    rows, marks = [], []
    for comp in c.comparisons:
        for m in comp.models:
            eff, iv = m.test.effect, m.test.effect_interval
            rows.append((Cell(m.model, m.model), Cell(f"{comp.from_wave} → {comp.to_wave}", comp.to_wave),
                         Cell("yes" if m.changed else "no"), Cell(fmt_p(m.test.p_value), m.test.p_value),
                         Cell(fmt_p(m.q_value), m.q_value),
                         Cell("—" if eff is None else f"{eff:+.3f}" + (
                             "" if iv is None else f" [{iv.low:+.3f}, {iv.high:+.3f}]"), eff),
                         Cell(served_text(m.served))))
            marks.append(m.changed)
    alpha = c.comparisons[0].alpha
    return Table(("model", "waves", "revised", "p", "q (BH)", "Jaccard change [interval]",
                  "served identity"), tuple(rows), table_id=f"over-time-revisions-{c.campaign}",
                 caption=f"Revision test per model and wave pair; revised at BH q ≤ {alpha:g} "
                         "(irbench waves); highlighted rows are flagged. Served identity: what the "
                         "provider said answered (model name, fingerprint, digest) where it changed "
                         "between the waves; unknown when a wave's rows name none.",
                 highlight=tuple(marks))


def _retirements(c: CampaignOverTime) -> Block:
    rows = [(Cell(m.model, m.model), Cell(f"wave {comp.to_wave}", comp.to_wave),
             Cell(f"{m.to_side.runs_retired} of {m.to_side.runs_total}", m.to_side.runs_retired))
            for comp in c.comparisons for m in comp.models if m.newly_retired]
    if not rows:
        return Note(f"{c.campaign}: no model met a 410 (retired) in a wave after one without.")
    return Table(("model", "retired in", "runs answered 410"), tuple(rows),
                 table_id=f"over-time-retirements-{c.campaign}",
                 caption="Models that answered 410 (retired) in a wave after one in which they did not.")


def over_time_blocks(campaigns: list[CampaignOverTime], style: PlotStyle = PlotStyle()) -> list[Block]:
    """The section's blocks; ``[]`` when no campaign has two waves."""
    if not campaigns:
        return []
    blocks: list[Block] = [Paragraph(
        "Campaigns measured in several waves, compared wave to wave from the stored runs: did a "
        "model change, or is it noise? \"no\" means no evidence of a change, not its absence.")]
    for c in campaigns:
        blocks.append(Heading(f"{c.campaign}: waves {', '.join(map(str, c.waves))}"))
        fig = jaccard_by_wave_plot(c, style)
        if fig is not None:
            blocks.append(fig)
        blocks += [_ranks_table(c), _revisions_table(c), _retirements(c)]
    return blocks
