"""`loraloom db check [--wait]`, what a Kubernetes pod's init container runs while the migration Job
upgrades the database (deploy/kubernetes): it fails on a database behind this version, succeeds once
the upgrade lands (waiting for it when told to), and refuses a database newer than this version at
once, since waiting cannot fix that."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script


def environment(database: Path) -> dict[str, str]:
    return {**os.environ, "LORALOOM_DATABASE_URL": f"sqlite:///{database}", "LORALOOM_DATA_DIR": str(database.parent)}


def run(args: list[str], database: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LORALOOM), *args], env=environment(database), capture_output=True, text=True,
                          timeout=120)


def test_check_fails_on_an_unmigrated_database_and_passes_after_the_upgrade(tmp_path):
    database = tmp_path / "loraloom.db"
    behind = run(["db", "check"], database)
    assert behind.returncode == 1 and "run `loraloom db upgrade` first" in behind.stderr
    assert run(["db", "upgrade"], database).returncode == 0
    current = run(["db", "check"], database)
    assert current.returncode == 0, current.stderr
    assert "is at revision" in current.stderr


def test_check_with_wait_returns_once_another_process_has_migrated(tmp_path):
    database = tmp_path / "loraloom.db"
    waiting = subprocess.Popen([str(LORALOOM), "db", "check", "--wait", "90"], env=environment(database),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Its first check has failed (it says why it waits) before the migration Job's part runs, so
        # it can only succeed by checking again.
        assert "waiting up to 90 s" in waiting.stderr.readline()
        assert run(["db", "upgrade"], database).returncode == 0
        _, stderr = waiting.communicate(timeout=120)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, stderr


def test_check_refuses_a_database_newer_than_this_version_without_waiting(tmp_path):
    database = tmp_path / "loraloom.db"
    assert run(["db", "upgrade"], database).returncode == 0
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'from-a-newer-release'")
    # A wait longer than the command's own timeout: only an immediate refusal returns in time.
    newer = run(["db", "check", "--wait", "600"], database)
    assert newer.returncode == 1
    assert "from-a-newer-release" in newer.stderr and "does not know" in newer.stderr
