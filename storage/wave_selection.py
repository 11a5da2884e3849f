"""Which measurement waves a reader of runs takes (``--wave latest|N|all``): a value object
without pyarrow at import time, so ``analysis.options`` stays light; resolving it reads the
store's ``waves/`` dataset (``storage.waves``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from storage.errors import StorageError

if TYPE_CHECKING:
    import pyarrow as pa


class WaveError(StorageError, ValueError):
    """A wave asked for that the store does not hold (a user error: the message says what exists)."""


class WaveSelection(BaseModel):
    """Which waves a reader of runs takes: ``wave`` (one number), ``every`` wave, or, when neither
    is set, each campaign's latest wave. Parsed from ``--wave`` by :meth:`parse`."""

    model_config = ConfigDict(frozen=True)

    wave: int | None = Field(default=None, ge=1)
    every: bool = False

    @classmethod
    def parse(cls, text: str | None) -> WaveSelection:
        """``None``/``latest`` -> the latest wave, ``all`` -> every wave, ``N`` -> wave N. Raises
        WaveError for anything else."""
        value = (text or "latest").strip().lower()
        if value == "latest":
            return cls()
        if value == "all":
            return cls(every=True)
        if value.isdigit() and int(value) >= 1:
            return cls(wave=int(value))
        raise WaveError(f"--wave {text!r}: give a wave number (1, 2, …), 'latest' or 'all'")

    def describe(self) -> str:
        return "every wave" if self.every else f"wave {self.wave}" if self.wave else "the latest wave"

    def resolve(self, root: Path, campaigns: Sequence[str] | None = None) -> SelectedWaves | None:
        """The waves selected in the store at ``root`` (of ``campaigns``; None = all); None for
        ``every`` (no filter). A number that no campaign holds is a WaveError naming the waves
        there are. Reads only ``waves/`` (a campaign without a row holds wave 1 only)."""
        if self.every:
            return None
        declared: dict[str, list[int]] = {}
        from storage.waves import declared_rows

        for row in declared_rows(root, campaigns):
            declared.setdefault(row["campaign"], [1]).append(row["wave"])
        if self.wave is None:
            return SelectedWaves({c: (max(ws),) for c, ws in declared.items()}, (1,))
        if self.wave != 1 and not any(self.wave in ws for ws in declared.values()):
            there = "; ".join(f"{c}: {', '.join(map(str, sorted(set(ws))))}" for c, ws in sorted(declared.items()))
            raise WaveError(f"--wave {self.wave}: the store holds no wave {self.wave} (waves: {there or 'only 1'}); "
                            "pass one of those, 'latest' or 'all'")
        return SelectedWaves({c: (self.wave,) if self.wave in ws else () for c, ws in declared.items()},
                             (1,) if self.wave == 1 else ())


@dataclass(frozen=True)
class SelectedWaves:
    """Resolved wave numbers: ``by_campaign`` for the campaigns with ``waves/`` rows, ``others``
    for every other campaign (which holds wave 1 only)."""

    by_campaign: dict[str, tuple[int, ...]]
    others: tuple[int, ...]

    def numbers(self) -> list[int]:
        """Every wave number selected somewhere: the filter to push into a read (a superset)."""
        return sorted({*self.others, *(w for ws in self.by_campaign.values() for w in ws)})

    def keep(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` (``campaign`` and ``wave`` columns) in their campaign's selected waves."""
        return table if table.num_rows == 0 else table.filter(self.mask(table))

    def mask(self, table: pa.Table) -> pa.ChunkedArray | pa.Array:
        """One boolean per row of ``table`` (``campaign`` and ``wave`` columns): whether the row
        is of its campaign's selected waves."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wave_type = table.schema.field("wave").type
        campaign = table["campaign"]
        if pa.types.is_dictionary(campaign.type):
            campaign = campaign.cast(pa.string())
        named = pa.array(sorted(self.by_campaign), pa.string())
        mask = pc.and_(pc.invert(pc.is_in(campaign, named)), pc.is_in(table["wave"], pa.array(self.others, wave_type)))
        for name, waves in self.by_campaign.items():
            term = pc.and_(pc.equal(campaign, name), pc.is_in(table["wave"], pa.array(waves, wave_type)))
            mask = pc.or_(mask, term)
        return pc.fill_null(mask, False)


def read_runs(
    root: Path, selection: WaveSelection, *, campaigns: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The runs of ``selection`` in the store at ``root`` (one row per run, ``RunStore.read_table``),
    ``columns`` only (``campaign`` and ``wave`` are read as well when a wave is selected)."""
    from storage.runs import RunStore

    store = RunStore(Path(root), fsync=False)
    selected = selection.resolve(root, campaigns)
    if selected is None:
        return store.read_table(campaigns=campaigns, columns=columns)
    wanted = None if columns is None else list(dict.fromkeys([*columns, "campaign", "wave"]))
    table = selected.keep(store.read_table(campaigns=campaigns, columns=wanted, waves=selected.numbers()))
    return table if columns is None else table.select(list(columns))
