"""Removing what a killed process left half-written: partial blobs, upload staging folders.

A process that dies by SIGKILL runs no cleanup, so its temporary files stay for ever unless a
later process removes them. That later process cannot tell a dead writer's file from one a live
process (another server sharing the data dir) is writing right now, except by age: only entries
untouched for longer than a grace period are removed.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def remove_stale_entries(directory: Path, pattern: str, *, grace_s: float) -> list[Path]:
    """Remove the entries of `directory` matching the glob `pattern` (files, or folders with all
    they hold) that nothing has modified for `grace_s` seconds. Returns what was removed."""
    if not directory.is_dir():
        return []
    cutoff = time.time() - grace_s
    removed = []
    for entry in directory.glob(pattern):
        try:
            if _last_modified(entry) >= cutoff:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:  # its writer finished (or another server cleaned it) meanwhile
            continue
        removed.append(entry)
    if removed:
        logger.info("removed %d stale leftover(s) of killed processes from %s", len(removed), directory)
    return removed


def _last_modified(entry: Path) -> float:
    """The newest mtime of the entry and, for a folder, of everything in it: writing into a file
    does not change its folder's mtime, so a folder's own mtime can look old while in use."""
    newest = entry.lstat().st_mtime
    if entry.is_dir() and not entry.is_symlink():
        for inner in entry.rglob("*"):
            newest = max(newest, inner.lstat().st_mtime)
    return newest
