"""Log lines and the log file: escape_controls, EscapingFormatter and the private file handlers.

Log lines carry values from requests (model names, paths, KB and file names,
header values).  A newline in one of them would start a line of its own that
reads like a record ragproxy never wrote ("... ERROR forged"); ANSI escapes
would drive the terminal.  EscapingFormatter escapes every control character
in the formatted line (C0, DEL, C1, and U+2028/U+2029, which some readers
also treat as line breaks), so one record is one line; a traceback, appended
after the message, keeps its lines.  The log file may hold request data, so
it is created readable by its owner only (0600), as the files holding keys are.
Several processes (serve's workers) write one file through
SharedRotatingFileHandler, which rotates it only under a lock they all take.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match):
    char = match.group()
    return _NAMED.get(char) or ("\\x%02x" % ord(char) if ord(char) < 0x100 else "\\u%04x" % ord(char))


def escape_controls(text):
    """``text`` on one line: control characters and Unicode line breaks as ``\\n``, ``\\x1b``, ``\\u2028``.

    Backslashes are left alone (Windows paths stay readable), so a literal
    ``\\n`` in a value reads the same as an escaped newline; neither breaks the line.
    """
    return _CONTROL.sub(_escaped, text)


class EscapingFormatter(logging.Formatter):
    """A Formatter whose records are one line each, whatever the logged values hold.

    Only the formatted message is escaped: ``exc_text`` and ``stack_info``,
    multi-line by design, follow it as Python formatted them.
    """

    def formatMessage(self, record):
        return escape_controls(super().formatMessage(record))


def _open_private(handler):
    # os.open's mode applies when the file is created; an existing file keeps its own.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_BINARY", 0)  # io translates newlines
    fd = os.open(handler.baseFilename, flags, 0o600)
    return open(fd, handler.mode, encoding=handler.encoding, errors=getattr(handler, "errors", None))


class PrivateFileHandler(logging.FileHandler):
    """A FileHandler (append) whose file, when it creates it, is readable by its owner only."""

    def _open(self):
        return _open_private(self)


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose files are readable by their owner only, the fresh one after a
    rollover as well (the rotated ones are renamed and keep their mode)."""

    def _open(self):
        return _open_private(self)


class SharedRotatingFileHandler(PrivateRotatingFileHandler):
    """A PrivateRotatingFileHandler for a file several processes write.

    A process rotating on its own judges the size by its own stream: after
    another process has rotated the file, that stream still points at the
    renamed one, so records land behind newer ones in the backups and the
    fresh file is rotated again early; and between its own writes the
    others' records are past its stream's position, so it lets the file grow
    past maxBytes.  Here each record is written under flock on ``FILE.lock``,
    after a look at whether the path still names this process's open file:
    if another process has rotated it, this one reopens it, else it seeks to
    the end, before the size is judged.  The lock file is opened per
    process, as a forked child would share its parent's open lock file and so
    its lock.  Where there is no fcntl, records go unlocked.
    """

    def __init__(self, *args, **kwargs):
        self._lock_fd, self._lock_pid = None, None
        super().__init__(*args, **kwargs)

    def emit(self, record):
        try:
            with self._file_lock():
                if self.stream is not None:
                    if self._moved():
                        self.stream.close()
                        self.stream = None  # the next write opens the file the path names now
                    else:
                        # The size is judged by tell(), which is where this process last wrote:
                        # the others' records since then are past it.
                        self.stream.seek(0, os.SEEK_END)
                super().emit(record)
        except Exception:
            self.handleError(record)

    def _moved(self):
        try:
            now = os.stat(self.baseFilename)
        except FileNotFoundError:
            return True
        mine = os.fstat(self.stream.fileno())
        return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)

    @contextlib.contextmanager
    def _file_lock(self):
        try:
            import fcntl
        except ImportError:
            yield
            return
        if self._lock_pid != os.getpid():
            self._lock_fd = os.open(self.baseFilename + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            self._lock_pid = os.getpid()
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self):
        if self._lock_fd is not None and self._lock_pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
        self._lock_fd = None
        super().close()
