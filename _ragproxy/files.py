"""files: TODO docstring."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


def atomic_write(path, data, mode=0o644):
    """Write ``data`` so that a crash leaves either the old file or the new one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # directory fsync is not possible everywhere (Windows)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def fsync_path(path, directory=False):
    """fsync a file or directory; directories cannot be opened on Windows."""
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


def human_size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
