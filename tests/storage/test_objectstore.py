"""The bucket store's pieces against a real S3 server (SeaweedFS on loopback): the client, the
mirror (pull, push, deletions, concurrent compaction) and the worker's uploader."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from storage.errors import ConfigError
from storage.objectstore.client import ObjectStoreError, ObjectStoreUnavailable, S3Client, ObjectStoreConfig
from storage.objectstore.location import S3Location, parse_store_url
from storage.objectstore.mirror import Mirror, synced
from storage.objectstore.uploader import Uploader
from tests.support.objectstore import s3_client


def test_store_urls_parse_and_bad_ones_say_how_to_fix() -> None:
    assert parse_store_url("s3://bucket-1/a/b/") == S3Location("bucket-1", "a/b")
    assert parse_store_url("s3://bkt").key("runs/x.parquet") == "runs/x.parquet"
    assert S3Location("bkt", "a").relative("a/runs/x") == "runs/x"
    for bad in ("s3://", "s3://B_ad/x", "s3://ok-bucket/a//b", "s3://ok-bucket/../x"):
        with pytest.raises(ConfigError, match="s3://BUCKET"):
            parse_store_url(bad)


def test_what_is_synced() -> None:
    assert synced("runs/measurement_date=2026-01-01/spool-a-00000001.parquet")
    assert synced(".irbench-store")
    assert not synced("runs/_spool/w-00000001.jsonl")
    assert not synced("runs/measurement_date=2026-01-01/.x.tmp")
    assert not synced(".irbench-mirror.json")


def test_client_round_trip_and_first_writer_wins(s3_env, s3_location, tmp_path: Path) -> None:
    client = s3_client(s3_location)
    src = tmp_path / "a.bin"
    src.write_bytes(b"one")
    key = s3_location.key("runs/a.bin")
    assert client.upload(src, key, if_absent=True)
    src.write_bytes(b"two")
    assert client.upload(src, key, if_absent=True) is None  # the first object stays
    info = client.download(key, tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"one" and info.size_bytes == 3
    assert set(client.list(s3_location.key(""))) == {key}
    client.delete([key])
    with pytest.raises(FileNotFoundError):
        client.download(key, tmp_path / "gone.bin")


def test_bad_credentials_are_named_and_never_echoed(s3_env, s3_location, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-9f8e7d")
    client = S3Client(s3_location)
    with pytest.raises(ObjectStoreError) as err:
        client.list(s3_location.key(""))
    text = str(err.value)
    assert "AWS_SECRET_ACCESS_KEY" in text and "not-the-secret-9f8e7d" not in text
    assert s3_env["AWS_ACCESS_KEY_ID"] not in text


def test_an_unreachable_store_is_unavailable_not_a_traceback(s3_location, monkeypatch, tmp_path) -> None:
    from deploy.processes import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k" * 8)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s" * 16)
    client = S3Client(s3_location, ObjectStoreConfig(endpoint_url=f"http://127.0.0.1:{free_port()}",
                                                     connect_timeout_s=0.5, max_attempts=1))
    with pytest.raises(ObjectStoreUnavailable, match="did not answer"):
        client.list("")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and synced(str(p.relative_to(root)))}


def test_mirrors_agree_and_only_changes_move(s3_env, s3_location, tmp_path: Path) -> None:
    a = Mirror(s3_client(s3_location), s3_location, tmp_path / "a")
    (a.root / "runs" / "d=1").mkdir(parents=True)
    (a.root / "runs" / "d=1" / "f1.parquet").write_bytes(b"x" * 100)
    (a.root / "runs" / "_spool").mkdir()
    (a.root / "runs" / "_spool" / "w.jsonl").write_bytes(b"local only")
    (a.root / ".irbench-store").write_text("id-1\n")
    first = a.push()
    assert first.files_moved == 2 and a.push().files_moved == 0  # nothing changed: nothing sent

    b = Mirror(s3_client(s3_location), s3_location, tmp_path / "b")
    assert b.pull().files_moved == 2
    assert _files(b.root) == _files(a.root) and not (b.root / "runs" / "_spool").exists()
    assert b.pull().files_moved == 0

    (a.root / "runs" / "d=1" / "f1.parquet").unlink()  # a compaction of A's
    (a.root / "runs" / "d=1" / "part-1.parquet").write_bytes(b"y" * 50)
    report = a.push()
    assert (report.files_moved, report.files_deleted) == (1, 1)
    pulled = b.pull()
    assert (pulled.files_moved, pulled.files_deleted) == (1, 1)
    assert _files(b.root) == _files(a.root)


def test_a_file_missing_locally_is_fetched_again_never_deleted_remotely(s3_env, s3_location, tmp_path: Path) -> None:
    a = Mirror(s3_client(s3_location), s3_location, tmp_path / "a")
    (a.root / "runs").mkdir()
    (a.root / "runs" / "f.parquet").write_bytes(b"z")
    a.push()
    fresh = Mirror(s3_client(s3_location), s3_location, tmp_path / "a")  # another process, same mirror
    (a.root / "runs" / "f.parquet").unlink()  # lost outside any verb
    assert fresh.push().files_deleted == 0
    assert fresh.pull().files_moved == 1 and (a.root / "runs" / "f.parquet").read_bytes() == b"z"


def test_pull_keys_fetches_named_files_without_listing(s3_env, s3_location, tmp_path: Path) -> None:
    a = Mirror(s3_client(s3_location), s3_location, tmp_path / "a")
    (a.root / "runs").mkdir()
    for i in range(3):
        (a.root / "runs" / f"f{i}.parquet").write_bytes(b"%d" % i)
    a.push()
    b = Mirror(s3_client(s3_location), s3_location, tmp_path / "b")
    calls = []
    real_list = b.client.list
    b.client.list = lambda prefix: calls.append(prefix) or real_list(prefix)  # type: ignore[method-assign]
    assert b.pull_keys(["runs/f1.parquet", "runs/missing.parquet"]).files_moved == 2
    assert sorted(_files(b.root)) == ["runs/f1.parquet"] and calls == []
    assert b.pull_keys(["runs/f1.parquet"]).files_moved == 0


def test_uploader_moves_each_file_once_and_survives_a_crash_after_upload(s3_env, s3_location, tmp_path: Path) -> None:
    root = tmp_path / "spool-root"
    part = root / "runs" / "measurement_date=2026-01-01"
    part.mkdir(parents=True)
    (part / "spool-w-00000001.parquet").write_bytes(b"rows-1")
    (part / ".spool-w-00000002.tmp").write_bytes(b"half")  # in flight: not yet published
    announced: list[str] = []
    up = Uploader(s3_client(s3_location), s3_location, root, on_uploaded=announced.extend)
    assert up.upload_pending() == ["runs/measurement_date=2026-01-01/spool-w-00000001.parquet"]
    assert not (part / "spool-w-00000001.parquet").exists() and (part / ".spool-w-00000002.tmp").exists()
    # killed after the upload, before the deletion: the spool republishes the same segment
    (part / "spool-w-00000001.parquet").write_bytes(b"rows-1")
    assert up.upload_pending() and up.files_present == 1 and up.files_uploaded == 1
    keys = s3_client(s3_location).list(s3_location.key(""))
    assert list(keys) == [s3_location.key("runs/measurement_date=2026-01-01/spool-w-00000001.parquet")]
    assert announced.count("runs/measurement_date=2026-01-01/spool-w-00000001.parquet") == 2


def test_uploader_keeps_files_while_the_store_is_down_and_says_so_once(s3_server, s3_env, s3_location, tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "runs").mkdir(parents=True)
    errors: list[Exception] = []
    recovered: list[bool] = []
    up = Uploader(s3_client(s3_location, connect_timeout_s=0.3, read_timeout_s=1.0, max_attempts=1), s3_location, root,
                  interval_s=0.05, on_error=errors.append, on_recovered=lambda: recovered.append(True))
    s3_server.stop(kill=True)
    try:
        (root / "runs" / "a.parquet").write_bytes(b"a")
        assert not up._pass() and not up._pass()
        assert (root / "runs" / "a.parquet").exists() and len(errors) == 1
        assert isinstance(errors[0], ObjectStoreUnavailable)
    finally:
        s3_server.start()
    deadline = time.monotonic() + 15
    while not up._pass() and time.monotonic() < deadline:  # the restarted server settles its volumes
        time.sleep(0.2)
    assert recovered == [True] and not (root / "runs" / "a.parquet").exists(), errors[1:]
    assert os.path.basename(next(iter(s3_client(s3_location).list(s3_location.key(""))))) == "a.parquet"
