"""Log lines and the log file (_ragproxy.logfile), in-process on real files under tmp_path.

escape_controls and EscapingFormatter keep one record on one line whatever a
logged value holds (a traceback keeps its own lines); the file handlers
create their files, the fresh one after a rollover too, readable by their
owner only.  tests/test_cli.py drives the same through a running server.
"""
import io
import logging
import os
import random
import stat
import subprocess
import sys

import pytest

from _ragproxy.logfile import (EscapingFormatter, PrivateFileHandler, PrivateRotatingFileHandler,
                              SharedRotatingFileHandler, escape_controls)

# Everything str.splitlines() breaks on, and the rest of C0, DEL and C1.
BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_escape_controls_names_the_common_ones_and_writes_the_rest_as_hex():
    assert escape_controls("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert escape_controls("\x00\x1b[31m\x7f\x85\x9f") == "\\x00\\x1b[31m\\x7f\\x85\\x9f"
    assert escape_controls("\u2028\u2029") == "\\u2028\\u2029"
    # Printable text, non-ASCII letters and backslashes are left as they are.
    text = "C:\\data\\kb  caf\u00e9 \u4e2d\u6587 \u2022 \U0001f600 ~"
    assert escape_controls(text) == text


def test_no_character_survives_that_splits_a_line():
    rng = random.Random(14)
    alphabet = BREAKS + "".join(map(chr, range(0x20))) + "\x7f" + "".join(map(chr, range(0x80, 0xa0))) + "ab \u00e9"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        out = escape_controls(text)
        assert out.isprintable() and len(out.splitlines()) == 1, repr(out)   # printable: no line breaks


def _record(msg, *args, exc_info=None):
    return logging.LogRecord("ragproxy", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_a_record_is_one_line_and_a_traceback_keeps_its_lines():
    fmt = EscapingFormatter("%(levelname)s %(message)s")
    line = fmt.format(_record("retrieval failed for %s (%s)", "m\nERROR forged", "kb\u2028x"))
    assert line == "WARNING retrieval failed for m\\nERROR forged (kb\\u2028x)"
    try:
        raise ValueError("boom")
    except ValueError:
        text = fmt.format(_record("internal error handling %s", "/v1/x\r\nERROR y", exc_info=sys.exc_info()))
    first, *rest = text.splitlines()
    assert first == "WARNING internal error handling /v1/x\\r\\nERROR y"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_the_log_files_are_created_private_and_stay_so_after_a_rollover(tmp_path):
    path = tmp_path / "rag-proxy.log"
    handler = PrivateRotatingFileHandler(str(path), maxBytes=200, backupCount=2, encoding="utf-8")
    handler.setFormatter(EscapingFormatter("%(message)s"))
    try:
        for i in range(20):
            handler.emit(_record("line %d %s", i, "x" * 40))
    finally:
        handler.close()
    names = sorted(os.listdir(str(tmp_path)))
    assert names == ["rag-proxy.log", "rag-proxy.log.1", "rag-proxy.log.2"]
    for name in names:
        assert stat.S_IMODE(os.stat(str(tmp_path / name)).st_mode) == 0o600, name
    plain = tmp_path / "one-shot.log"
    handler = PrivateFileHandler(str(plain), encoding="utf-8")
    handler.emit(_record("one"))
    handler.close()
    handler = PrivateFileHandler(str(plain), encoding="utf-8")   # appends to what is there
    handler.emit(_record("two"))
    handler.close()
    assert plain.read_text() == "one\ntwo\n" and stat.S_IMODE(plain.stat().st_mode) == 0o600


def test_an_existing_log_file_keeps_its_mode(tmp_path):
    path = tmp_path / "rag-proxy.log"
    path.write_text("old\n")
    os.chmod(str(path), 0o640)   # a deliberate choice (a log shipper's group), not ragproxy's to undo
    handler = PrivateFileHandler(str(path), encoding="utf-8")
    handler.emit(_record("new"))
    handler.close()
    assert path.read_text() == "old\nnew\n"
    if os.name != "nt":
        assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_stream_handler_with_the_formatter_writes_escaped_lines():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(EscapingFormatter("%(message)s"))
    handler.emit(_record("model %r and %s", "a\nb", "c\x1b[2Jd"))
    assert out.getvalue() == "model 'a\\nb' and c\\x1b[2Jd\n"


WRITER = """
import logging, sys
sys.path.insert(0, {root!r})
from _ragproxy.logfile import {handler}
handler = {handler}({path!r}, maxBytes=4000, backupCount=500, encoding="utf-8")
log = logging.getLogger("w")
log.addHandler(handler)
log.setLevel(logging.INFO)
for n in range(400):
    log.info("writer %s record %04d %s", sys.argv[1], n, "x" * 40)
"""


def _write_from_two_processes(tmp_path, handler):
    path = str(tmp_path / "rag-proxy.log")
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    handler=handler, path=path))
    procs = [subprocess.Popen([sys.executable, str(script), name]) for name in "AB"]
    assert [p.wait(60) for p in procs] == [0, 0]
    lines = []
    for name in os.listdir(str(tmp_path)):
        if name.startswith("rag-proxy.log") and not name.endswith(".lock"):
            with open(str(tmp_path / name), encoding="utf-8") as f:
                lines += f.read().splitlines()
    return lines, [os.path.getsize(str(tmp_path / n)) for n in os.listdir(str(tmp_path))
                   if n.startswith("rag-proxy.log") and not n.endswith(".lock")]


def test_two_processes_rotating_one_shared_log_lose_no_record(tmp_path):
    lines, sizes = _write_from_two_processes(tmp_path, "SharedRotatingFileHandler")
    assert sorted(lines) == sorted(f"writer {w} record {n:04d} {'x' * 40}" for w in "AB" for n in range(400))
    assert max(sizes) <= 4000 and len(sizes) > 10   # rotated many times, each file within its size


def _alternate(tmp_path, handler_class):
    """Two handlers on one file, as two processes have, writing in turn: (the records' numbers, oldest file
    first, and the rotated files' sizes)."""
    path = str(tmp_path / "rag-proxy.log")
    handlers = [handler_class(path, maxBytes=1000, backupCount=100, encoding="utf-8") for _ in range(2)]
    try:
        for n in range(200):
            handler = handlers[n % 2]
            handler.handle(logging.makeLogRecord({"msg": "record %04d %s", "args": (n, "y" * 30)}))
    finally:
        for handler in handlers:
            handler.close()
    names = sorted((n for n in os.listdir(str(tmp_path)) if n.startswith("rag-proxy.log") and not n.endswith(".lock")),
                   key=lambda n: -int(n.rsplit(".", 1)[1]) if n[-1].isdigit() else 0)
    numbers = []
    for name in names:
        with open(str(tmp_path / name), encoding="utf-8") as f:
            numbers += [int(line.split()[1]) for line in f]
    return numbers, [os.path.getsize(str(tmp_path / n)) for n in names[:-1]]


def test_handlers_taking_turns_on_one_file_rotate_it_in_order_only_when_shared(tmp_path):
    record = len(f"record 0000 {'y' * 30}\n")
    (tmp_path / "shared").mkdir()
    numbers, backups = _alternate(tmp_path / "shared", SharedRotatingFileHandler)
    assert numbers == list(range(200))
    assert backups and min(backups) > 1000 - 2 * record   # each rotated when the next record would not fit
    # Why the shared handler exists: a handler rotating on its own goes on writing to the file the other
    # has just rotated away, so records land in backups behind newer ones (and backupCount drops them early).
    (tmp_path / "own").mkdir()
    numbers, _ = _alternate(tmp_path / "own", PrivateRotatingFileHandler)
    assert sorted(numbers) == list(range(200)) and numbers != list(range(200))
