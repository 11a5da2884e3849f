"""A worker reads its knobs from ``IRBENCH_<FIELD>``; the store root is ``IRBENCH_DATA``, the
same name every command's ``--data`` reads, and the old ``IRBENCH_DATA_DIR`` is refused with
the name to use."""

from __future__ import annotations

import pytest

from workers.celery.runtime import WorkerSettings
from workers.errors import ConfigError


def test_the_store_root_is_irbench_data() -> None:
    settings = WorkerSettings.from_env("redis://x", {"IRBENCH_DATA": "/srv/data", "IRBENCH_CLAIM_TTL_S": "12"})
    assert settings.data_dir == "/srv/data"
    assert settings.claim_ttl_s == 12.0
    assert WorkerSettings.env_name("data_dir") == "IRBENCH_DATA"
    assert WorkerSettings.env_name("claim_ttl_s") == "IRBENCH_CLAIM_TTL_S"


def test_the_old_name_is_refused_with_the_new_one() -> None:
    with pytest.raises(ConfigError, match="set IRBENCH_DATA=/srv/old instead") as info:
        WorkerSettings.from_env("redis://x", {"IRBENCH_DATA_DIR": "/srv/old"})
    assert "\n" not in str(info.value)


def test_the_new_name_wins_when_both_are_set() -> None:
    both = {"IRBENCH_DATA_DIR": "/srv/old", "IRBENCH_DATA": "/srv/new"}
    assert WorkerSettings.from_env("redis://x", both).data_dir == "/srv/new"


def test_a_bad_number_names_its_variable() -> None:
    with pytest.raises(ConfigError, match="IRBENCH_SPOOL_MAX_ROWS='many' is not a number"):
        WorkerSettings.from_env("redis://x", {"IRBENCH_SPOOL_MAX_ROWS": "many"})


def test_a_switch_reads_one_or_zero_and_refuses_anything_else() -> None:
    assert WorkerSettings.from_env("redis://x", {}).intent_journal is True
    assert WorkerSettings.from_env("redis://x", {"IRBENCH_INTENT_JOURNAL": "0"}).intent_journal is False
    assert WorkerSettings.from_env("redis://x", {"IRBENCH_INTENT_JOURNAL": "true"}).intent_journal is True
    with pytest.raises(ConfigError, match="IRBENCH_INTENT_JOURNAL='maybe' is not a switch"):
        WorkerSettings.from_env("redis://x", {"IRBENCH_INTENT_JOURNAL": "maybe"})
