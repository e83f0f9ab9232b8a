"""Small file-system helpers every layer shares: atomic writes, fsync, leftovers, sizes, times, SQLite opens.

atomic_write is the one way ragproxy replaces a file: a temporary file in
the same directory, fsynced, renamed over the target, then the directory
fsynced, so a crash leaves the old file or the new one, never a torn one.
retry_while_locked is how a SQLite file that several processes open at once
gets past SQLite's "database is locked" from the switch to WAL.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time


def atomic_write(path, data, mode=0o644, fsync=True):
    """Replace ``path`` with ``data`` so that a crash leaves either the old file or the new one."""
    with atomic_file(path, mode, fsync) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path, mode=0o644, fsync=True):
    """A binary file to write that replaces ``path`` when the block ends without an error.

    The file is ``.NAME.*.tmp`` beside ``path`` until then (see temp_name_of);
    an error removes it and leaves ``path`` as it was.  With ``fsync`` (the
    default) the file is fsynced before the rename and the directory after
    it, so the new contents survive a power cut once the block has ended.
    Only a caller that fsyncs the files itself later turns that off (a
    store generation: its commit fsyncs every file once).
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=temp_name_of(os.path.basename(path)), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_path(directory, directory=True)


def temp_name_of(name):
    """How atomic_file's temporary file for ``name`` begins (it ends in ``.tmp``): for clean-ups."""
    return "." + name + "."


def fsync_path(path, directory=False):
    """fsync a file or directory; where a directory cannot be (Windows), that is skipped."""
    flags = os.O_RDONLY if (directory or os.name != "nt") else os.O_RDWR
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def remove_leftover_dirs(root, prefix, abandoned=lambda path: True):
    """Delete the folders in ``root`` named ``prefix...`` that ``abandoned(path)`` says a crash
    left behind (never through a symlink); returns their paths."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if name.startswith(prefix) and os.path.isdir(path) and not os.path.islink(path) and abandoned(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def iso_utc(timestamp):
    """A unix time as ISO 8601 in UTC to the second (``2026-12-02T02:46:16Z``); None for none."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp)) if timestamp else None


def human_size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def retry_while_locked(action, attempts=8, sleep=time.sleep):
    """``action()``, called again while SQLite answers "database is locked": after 10 ms,
    then twice as long each time (2.55 s in all over 8 attempts); any other error, or the
    last attempt's, is raised.

    Processes that open a new database file together (serve's workers start at once; the
    CLI beside serve) meet that error from the switch to WAL, where SQLite calls no busy
    handler.
    """
    import sqlite3  # here: a Python built without sqlite3 still imports this module
    for attempt in range(attempts):
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            sleep(0.01 * 2 ** attempt)
    raise AssertionError("unreachable")
