"""Token prices as configuration: where a model's price comes from, and the shared price file.

A model's price (US dollars per million tokens, ``input_usd_per_mtok`` / ``output_usd_per_mtok``)
is taken, field by field, from the first of: its ``[models.X]`` table (or ``[defaults]``), the
campaign's price file (``prices = "prices.toml"``, relative to the campaign file), its endpoint's
table. A price file is a TOML mapping of model id → prices, shareable between campaigns::

    ["gpt-4o-mini"]
    input_usd_per_mtok = 0.15
    output_usd_per_mtok = 0.60

No price is built in: a model without one has an unknown cost, never a zero one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from pydantic import ValidationError

from storage.prices import TokenPrice
from workers.errors import ConfigError

PRICE_FIELDS = ("input_usd_per_mtok", "output_usd_per_mtok")


def price_file_problems(fname: str, path: Path | None) -> list[str]:
    """One line per problem of the price file at ``path`` (none when it is valid or not given)."""
    if path is None:
        return []
    try:
        load_price_file(path)
    except ConfigError as exc:
        return [f"{fname}: prices: {line}" for line in exc.problems]
    return []


def load_price_file(path: Path) -> dict[str, TokenPrice]:
    """Model id → price from a price file; ``ConfigError`` naming the file and the entry."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"price file {path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"price file {path}: not valid UTF-8 TOML ({exc})") from None
    out: dict[str, TokenPrice] = {}
    problems: list[str] = []
    for model, entry in raw.items():
        if not isinstance(entry, dict):
            problems.append(f"price file {path}: {model}: expected a table with {' and '.join(PRICE_FIELDS)}")
            continue
        try:
            out[model] = TokenPrice.model_validate(entry)
        except ValidationError as err:
            for e in err.errors():
                field = ".".join(str(p) for p in e["loc"])
                problems.append(f"price file {path}: {model}.{field}: {e['msg']}")
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"price file {path}: {len(problems)} problems", problems)
    return out
