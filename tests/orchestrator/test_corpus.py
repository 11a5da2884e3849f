"""Corpus loading on real files: identity by sha256, dedupe, per-file rejection, manifest provenance."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pytest

from orchestrator.campaign.corpus import load_corpus
from orchestrator.campaign.spec import CorpusSpec
from workers.errors import ConfigError
from tests.support.paths import ARTIFACT as _ARTIFACT

ARTIFACT = _ARTIFACT / "corpus"
HEADER = "file,label,repo,path,commit,html_url,license,sha256\n"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "prompts"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"Say hello.\n")
    (root / "sub" / "b.md").write_bytes("# Title\n\u00e9t\u00e9 {% if x %}{{ y }}{% endif %}\n".encode())
    (root / "c.prompt.rtpl").write_bytes(b"// @rule RULE:x category=policy priority=1\nDo x.\n")
    (root / "sub" / "copy_of_a.txt").write_bytes(b"Say hello.\n")  # duplicate content of a.txt
    (root / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (root / "empty.md").write_bytes(b"")
    (root / "blank.txt").write_bytes(b"  \n\n")
    (root / "big.txt").write_bytes(b"x" * 500)
    (root / "ignored.py").write_bytes(b"print('not a prompt')\n")
    return tmp_path


def test_tree_identity_dedupe_and_rejections(tree: Path) -> None:
    corpus = load_corpus(CorpusSpec(paths=[Path("prompts")], max_file_bytes=200), tree)
    names = [p.name for p in corpus.prompts]
    assert names == ["a.txt", "c.prompt.rtpl", "sub/b.md"]
    for p in corpus.prompts:
        assert p.sha256 == sha(p.path.read_bytes())
        assert p.text == p.path.read_text(encoding="utf-8")
        assert p.license is None and p.source is None and p.manifest_label is None
    assert corpus.duplicates == [("a.txt", "sub/copy_of_a.txt", sha(b"Say hello.\n"))]
    rejected = {Path(path).name: reason for path, reason in corpus.rejected}
    assert set(rejected) == {"latin1.txt", "empty.md", "blank.txt", "big.txt"}
    assert "latin1.txt" in rejected["latin1.txt"] and "UTF-8" in rejected["latin1.txt"]
    assert "empty" in rejected["empty.md"] and "empty" in rejected["blank.txt"]
    assert "500 bytes > max_file_bytes=200" in rejected["big.txt"]
    # deterministic: a second load is identical
    assert load_corpus(CorpusSpec(paths=[Path("prompts")], max_file_bytes=200), tree) == corpus


def test_explicit_files_globs_and_absolute_paths(tree: Path) -> None:
    root = tree / "prompts"
    corpus = load_corpus(CorpusSpec(paths=[root / "sub" / "b.md", root], globs=["*.rtpl"]), Path("/nonexistent"))
    assert [p.name for p in corpus.prompts] == ["b.md", "c.prompt.rtpl"]
    assert corpus.rejected == [] and corpus.duplicates == []


def test_missing_path_and_empty_corpus_are_config_errors(tree: Path) -> None:
    with pytest.raises(ConfigError, match=r"corpus.paths\[1\]: '.*nope' does not exist"):
        load_corpus(CorpusSpec(paths=[Path("prompts"), Path("nope")]), tree)
    with pytest.raises(ConfigError, match="no usable prompt left"):
        load_corpus(CorpusSpec(paths=[Path("prompts")], globs=["*.json"]), tree)
    only_bad = tree / "bad"
    only_bad.mkdir()
    (only_bad / "e.txt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"no usable prompt left \(e.txt: empty"):
        load_corpus(CorpusSpec(paths=[only_bad]), tree)


def write_manifest(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        fh.write(HEADER)
        csv.writer(fh).writerows(rows)
    return path


def test_manifest_provenance_licence_gate_and_sha_fallback(tree: Path) -> None:
    a = sha(b"Say hello.\n")
    c = sha((tree / "prompts" / "c.prompt.rtpl").read_bytes())
    b = sha((tree / "prompts" / "sub" / "b.md").read_bytes())
    write_manifest(
        tree / "m.csv",
        [
            ["a.txt", "skill", "o/r", "a.txt", "abc", "https://example.org/a", "MIT", a],
            ["c.prompt.rtpl", "synthetic", "", "", "", "", "GPL-3.0", ""],  # empty sha: not checked
            ["renamed_b.md", "skill", "o/r", "b.md", "abc", "https://example.org/b", "Apache-2.0", b],  # by sha
            ["not_in_corpus.md", "skill", "", "", "", "", "MIT", "0" * 64],
        ],
    )
    spec = CorpusSpec(paths=[Path("prompts")], manifest=Path("m.csv"), max_file_bytes=200)
    corpus = load_corpus(spec, tree)
    got = {p.name: (p.license, p.source, p.manifest_label) for p in corpus.prompts}
    assert got == {
        "a.txt": ("MIT", "https://example.org/a", "skill"),
        "c.prompt.rtpl": ("GPL-3.0", None, "synthetic"),
        "sub/b.md": ("Apache-2.0", "https://example.org/b", "skill"),
    }
    gated = load_corpus(spec.model_copy(update={"license_allow": ["MIT", "Apache-2.0"]}), tree)
    assert [p.name for p in gated.prompts] == ["a.txt", "sub/b.md"]
    reasons = [r for _, r in gated.rejected if r.startswith("c.prompt.rtpl")]
    assert len(reasons) == 1 and "'GPL-3.0'" in reasons[0] and "license_allow" in reasons[0]
    assert c not in {p.sha256 for p in gated.prompts}


def test_manifest_sha_mismatch_names_both(tree: Path) -> None:
    write_manifest(tree / "m.csv", [["a.txt", "skill", "", "", "", "", "MIT", "f" * 64]])
    with pytest.raises(ConfigError) as ei:
        load_corpus(CorpusSpec(paths=[Path("prompts")], manifest=Path("m.csv")), tree)
    msg = str(ei.value)
    assert "m.csv" in msg and str(tree / "prompts" / "a.txt") in msg
    assert "f" * 64 in msg and sha(b"Say hello.\n") in msg


def test_manifest_without_file_column(tree: Path) -> None:
    (tree / "m.csv").write_text("name,license\na.txt,MIT\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no 'file' column"):
        load_corpus(CorpusSpec(paths=[Path("prompts")], manifest=Path("m.csv")), tree)


@pytest.mark.usefixtures("artifact_dir")  # a clear error when the artifact is not there
def test_paper_artifact_github_corpus_with_manifest() -> None:
    with (ARTIFACT / "MANIFEST.csv").open(newline="", encoding="utf-8") as fh:
        rows = {r["file"]: r for r in csv.DictReader(fh)}
    files = sorted(f for f in (ARTIFACT / "github").iterdir() if f.is_file())
    corpus = load_corpus(CorpusSpec(paths=[Path("github")], manifest=Path("MANIFEST.csv")), ARTIFACT)
    assert [p.name for p in corpus.prompts] == [f.name for f in files]
    assert corpus.rejected == [] and corpus.duplicates == []
    for p in corpus.prompts:
        row = rows[p.name]
        assert p.sha256 == row["sha256"] == sha(p.path.read_bytes())
        assert (p.license, p.source, p.manifest_label) == (row["license"], row["html_url"], row["label"])
    expected_mit = sorted(f.name for f in files if rows[f.name]["license"] == "MIT")
    assert 0 < len(expected_mit) < len(files)  # the artifact mixes licences, so the gate is exercised
    gated = load_corpus(
        CorpusSpec(paths=[Path("github")], manifest=Path("MANIFEST.csv"), license_allow=["MIT"]), ARTIFACT
    )
    assert [p.name for p in gated.prompts] == expected_mit
    assert len(gated.rejected) == len(files) - len(expected_mit)
