"""Compare two ``irbench analyze`` output directories table by table (bit-for-bit).

Every ``*.parquet`` under ``A`` must exist under ``B`` (same relative path) and be
``Table.equals`` to it (values, types and order; schema metadata ignored); the manifests must
agree apart from the (dotted) keys listed in ``--ignore`` (default ``generated_at``; e.g.
``options.interval_threads`` for an option the other tree does not have).
Prints one line per file and exits 1 on the first kind of difference found (all are listed).

Usage: python bench/analysis_compare.py OUT_A OUT_B [--ignore generated_at,options.interval_threads]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def compare(a: Path, b: Path, ignore: set[str]) -> list[str]:
    """The differences between output directories ``a`` and ``b`` (empty: identical)."""
    diffs = []
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in sorted(set(files_a) ^ set(files_b)):
        diffs.append(f"{rel}: only in {'A' if rel in files_a else 'B'}")
    for rel in sorted(set(files_a) & set(files_b)):
        if rel.suffix == ".parquet":
            ta, tb = pq.read_table(a / rel), pq.read_table(b / rel)
            same = ta.equals(tb)
            print(f"{rel}: {ta.num_rows} rows, {'equal' if same else 'DIFFERENT'}")
            if not same:
                diffs.append(f"{rel}: tables differ")
        elif rel.name == "manifest.json":
            ma, mb = (json.loads((d / rel).read_text()) for d in (a, b))
            for key in ignore:  # dotted paths: options.interval_threads
                for m in (ma, mb):
                    *parents, leaf = key.split(".")
                    for p in parents:
                        m = m.get(p, {}) if isinstance(m, dict) else {}
                    if isinstance(m, dict):
                        m.pop(leaf, None)
            same = ma == mb
            print(f"{rel}: {'equal' if same else 'DIFFERENT'} (ignoring {sorted(ignore)})")
            if not same:
                diffs.append(f"{rel}: manifests differ in "
                             f"{sorted(k for k in ma.keys() | mb.keys() if ma.get(k) != mb.get(k))}")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--ignore", default="generated_at")
    args = ap.parse_args()
    diffs = compare(args.a, args.b, {k for k in args.ignore.split(",") if k})
    for d in diffs:
        print("DIFF", d)
    print("identical" if not diffs else f"{len(diffs)} differences")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
