"""Load a prompt corpus: files identified by the sha256 of their bytes, with optional provenance.

Input: a ``CorpusSpec`` (paths: files or directories, globs, optional manifest CSV, optional
licence allow-list, a size limit in bytes) and the directory relative paths resolve against.
Output: a ``Corpus`` whose prompts are ordered by name, with the duplicates collapsed and every
excluded file reported — one bad file never affects the others. Whole-corpus problems (a
missing path, a bad manifest, a manifest hash that disagrees with its file, nothing left to run)
raise ``ConfigError``.

Names: a file found under a directory is named by its path relative to that directory (POSIX
separators); a file given directly is named by its file name.

Manifest rows (columns ``file,label,repo,path,commit,html_url,license,sha256``; only ``file``
is required) match a prompt by its name, else by its file name when that is unambiguous, else
by the ``sha256`` column. Rows that match no file are ignored (a manifest may cover more than
the campaign uses).
"""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.campaign.spec import CorpusSpec
from workers.errors import ConfigError

MANIFEST_COLUMNS = ("file", "label", "repo", "path", "commit", "html_url", "license", "sha256")


@dataclass(frozen=True)
class Prompt:
    sha256: str
    name: str
    path: Path
    text: str
    license: str | None = None
    source: str | None = None
    manifest_label: str | None = None


@dataclass(frozen=True)
class Corpus:
    prompts: list[Prompt]
    duplicates: list[tuple[str, str, str]] = field(default_factory=list)  # (kept_name, dropped_name, sha256)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    def by_sha256(self) -> dict[str, Prompt]:
        return {p.sha256: p for p in self.prompts}


@dataclass(frozen=True)
class _Candidate:
    name: str
    path: Path
    data: bytes
    sha256: str


def _resolve(base_dir: Path, p: Path) -> Path:
    p = Path(p).expanduser()
    return p if p.is_absolute() else base_dir / p


def _discover(spec: CorpusSpec, base_dir: Path, problems: list[str]) -> tuple[list[tuple[str, Path]], dict[Path, int]]:
    """(name, path) for every file the spec selects (a file reached twice is listed once), and
    the files named directly in ``corpus.paths`` with their index there."""
    found: dict[Path, str] = {}
    explicit: dict[Path, int] = {}
    for i, raw in enumerate(spec.paths):
        root = _resolve(base_dir, raw)
        if root.is_file():
            found.setdefault(root.resolve(), root.name)
            explicit.setdefault(root.resolve(), i)
        elif root.is_dir():
            for pattern in spec.globs:
                for f in root.glob(pattern):
                    if f.is_file():
                        found.setdefault(f.resolve(), f.relative_to(root).as_posix())
        else:
            problems.append(f"corpus.paths[{i}]: {str(root)!r} does not exist; fix the path (relative paths resolve against {str(base_dir)!r})")
    return [(name, path) for path, name in found.items()], explicit


def _read(name: str, path: Path, max_bytes: int) -> tuple[_Candidate | None, str | None]:
    """Read one file; return (candidate, None) or (None, reason it was rejected)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return None, f"{name}: too large ({size} bytes > max_file_bytes={max_bytes}); raise corpus.max_file_bytes or drop the file"
        data = path.read_bytes()
    except OSError as exc:
        return None, f"{name}: cannot be read ({exc.strerror or exc})"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"{name}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); re-encode it as UTF-8"
    if not text.strip():
        return None, f"{name}: empty ({len(data)} bytes, no text); remove it from the corpus"
    if "\x00" in text:
        return None, f"{name}: binary (NUL byte at offset {data.index(0)}), not a prompt; remove it from the corpus"
    return _Candidate(name, path, data, hashlib.sha256(data).hexdigest()), None


def _load_manifest(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            cols = [c.strip() for c in (reader.fieldnames or [])]
            if "file" not in cols:
                raise ConfigError(
                    f"{path}: manifest has no 'file' column (found: {', '.join(cols) or 'nothing'}); "
                    f"expected columns {','.join(MANIFEST_COLUMNS)}"
                )
            rows = [{(k or "").strip(): (v or "").strip() for k, v in r.items()} for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: cannot read manifest CSV ({exc})") from None
    dup = sorted(f for f, n in Counter(r["file"] for r in rows).items() if n > 1)
    if dup:
        raise ConfigError(f"{path}: manifest lists {', '.join(dup)} more than once; keep one row per file")
    return rows


def _match_manifest(cands: list[_Candidate], rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """Candidate name -> manifest row."""
    by_file = {r["file"]: r for r in rows}
    by_sha = {r["sha256"].lower(): r for r in rows if r.get("sha256")}
    basenames: dict[str, int] = {}
    for c in cands:
        basenames[Path(c.name).name] = basenames.get(Path(c.name).name, 0) + 1
    out = {}
    for c in cands:
        base = Path(c.name).name
        row = by_file.get(c.name) or (by_file.get(base) if basenames[base] == 1 else None) or by_sha.get(c.sha256)
        if row is not None:
            out[c.name] = row
    return out


def _candidates(spec: CorpusSpec, base_dir: Path, problems: list[str], rejected: list[tuple[str, str]]) -> list[_Candidate]:
    """The readable corpus files, sorted by name; unreadable ones rejected (or, when named
    explicitly in ``corpus.paths``, a problem)."""
    cands: list[_Candidate] = []
    found, explicit = _discover(spec, base_dir, problems)
    for name, path in found:
        cand, reason = _read(name, path, spec.max_file_bytes)
        if cand is None and path in explicit:  # a file the user named: its problem is the user's error
            problems.append(f"corpus.paths[{explicit[path]}]: {reason}")
        elif cand is None:
            rejected.append((str(path), reason or "rejected"))
        else:
            cands.append(cand)
    cands.sort(key=lambda c: (c.name, str(c.path)))
    return cands


def _manifest_rows(spec: CorpusSpec, base_dir: Path, cands: list[_Candidate], problems: list[str]
                   ) -> dict[str, dict[str, str]]:
    """Each candidate's manifest row (by name); a row whose sha256 disagrees with its file is a problem."""
    if spec.manifest is None:
        return {}
    manifest_path = _resolve(base_dir, spec.manifest)
    if not manifest_path.is_file():
        problems.append(f"corpus.manifest: {str(manifest_path)!r} does not exist")
        return {}
    rows = _match_manifest(cands, _load_manifest(manifest_path))
    for c in cands:
        row = rows.get(c.name)
        if row and row.get("sha256") and row["sha256"].lower() != c.sha256:
            problems.append(
                f"manifest {str(manifest_path)!r} row {row['file']!r} says sha256 {row['sha256']} but file "
                f"{str(c.path)!r} has sha256 {c.sha256}; the file changed or the row is wrong - fix one of them"
            )
    return rows


def _check_names(cands: list[_Candidate], problems: list[str]) -> None:
    names: dict[str, Path] = {}
    for c in cands:
        if c.name in names:
            problems.append(
                f"two corpus files share the name {c.name!r} ({str(names[c.name])!r} and {str(c.path)!r}); "
                "list them under distinct directory roots or rename one"
            )
        names.setdefault(c.name, c.path)


def _prompts(spec: CorpusSpec, cands: list[_Candidate], rows: dict[str, dict[str, str]],
             rejected: list[tuple[str, str]]) -> tuple[list[Prompt], list[tuple[str, str, str]]]:
    """The prompts kept (first of each content, licence allowed) and the duplicates collapsed."""
    prompts: list[Prompt] = []
    duplicates: list[tuple[str, str, str]] = []
    kept: dict[str, str] = {}
    allow = set(spec.license_allow) if spec.license_allow is not None else None
    for c in cands:
        if c.sha256 in kept:
            duplicates.append((kept[c.sha256], c.name, c.sha256))
            continue
        kept[c.sha256] = c.name
        row = rows.get(c.name, {})
        lic = row.get("license") or None
        if allow is not None and lic not in allow:
            why = f"licence {lic!r}" if lic else "no licence known (not in the manifest)"
            rejected.append((str(c.path), f"{c.name}: {why} is not in corpus.license_allow {sorted(allow)}"))
            continue
        prompts.append(Prompt(
            sha256=c.sha256, name=c.name, path=c.path, text=c.data.decode("utf-8"), license=lic,
            source=row.get("html_url") or None, manifest_label=row.get("label") or None,
        ))
    return prompts, duplicates


def load_corpus(spec: CorpusSpec, base_dir: Path) -> Corpus:
    """Select, read, check and deduplicate the corpus files; see the module docstring."""
    base_dir = Path(base_dir)
    problems: list[str] = []
    rejected: list[tuple[str, str]] = []
    cands = _candidates(spec, base_dir, problems, rejected)
    rows = _manifest_rows(spec, base_dir, cands, problems)
    _check_names(cands, problems)
    if problems:
        raise ConfigError(f"corpus: {len(problems)} problem(s)", problems)
    prompts, duplicates = _prompts(spec, cands, rows, rejected)
    if not prompts:
        detail = "; ".join(r for _, r in rejected[:5]) or f"no file matched globs {spec.globs} under {[str(p) for p in spec.paths]}"
        raise ConfigError(f"corpus: no usable prompt left ({detail}); check corpus.paths, corpus.globs and corpus.license_allow")
    rejected.sort()
    return Corpus(prompts=prompts, duplicates=duplicates, rejected=rejected)
