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
import sys

import pytest

from _ragproxy.logfile import EscapingFormatter, PrivateFileHandler, PrivateRotatingFileHandler, escape_controls

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
