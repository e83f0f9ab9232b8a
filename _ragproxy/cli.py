"""The command line: ``python ragproxy.py [serve|index|search|kb|import|mcp] ...``.

Parses arguments, prepares the data directory and logging, loads the config
and runs a command: serve wires App, Admin, the server and the config
watcher together and handles signals.  Each command imports the modules it
uses inside its function, so a command loads only what it needs:
``--version`` imports nothing beyond this module and ``deps``
(bench/startup.py measures it).

May import: every other module.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import __version__, deps


def _log():
    """The ragproxy logger; logging is imported by the commands that log, not by ``--version``."""
    import logging
    return logging.getLogger("ragproxy")


_DATA_SUBDIRS = ("config", "vectordb", "documents", "cache/embedding", "cache/rerank", "logs")


def version_text():
    """One line: the version, Python, the optional packages found, and where the code was loaded from.

    Nothing optional is imported for it (deps.installed()): ``--version`` is
    answered about as fast as Python starts.
    """
    found = deps.installed()

    def listed(features):
        return ", ".join(f"{name} {version or '(version unknown)'}" + (" (vendored)" if where else "")
                         for name, (version, where) in found.items() if name in features)

    accelerated = listed(deps.ACCELERATORS)
    if deps.pure_mode():
        mode = "pure mode (RAGPROXY_PURE)"
    else:
        mode = "accelerated: " + accelerated if accelerated else "stdlib only"
    formats = listed(set(found) - set(deps.ACCELERATORS))
    if formats:
        mode += "; PDF: " + formats
    code = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return f"ragproxy {__version__} (Python {sys.version.split()[0]}; {mode}) from {code}"


def _prepare_data_dir(data_dir):
    for sub in _DATA_SUBDIRS:
        os.makedirs(os.path.join(data_dir, sub), exist_ok=True)


def _load_secret_key(data_dir, environ, rng=None):
    """The admin panel key: RAGPROXY_SECRET_KEY, else config/secret_key.yaml (made on first start).

    Returns ``(key, created)``.
    """
    from .config import ConfigError
    from .files import atomic_write
    from .yamlish import load_yaml

    if environ.get("RAGPROXY_SECRET_KEY"):
        return environ["RAGPROXY_SECRET_KEY"], False
    path = os.path.join(data_dir, "config", "secret_key.yaml")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            data, _ = load_yaml(f.read())
        if isinstance(data, dict) and isinstance(data.get("secret_key"), str) and data["secret_key"]:
            return data["secret_key"], False
        raise ConfigError([("secret_key", None, "expected 'secret_key: <value>'")], path)
    if rng is None:
        import secrets as rng
    key = rng.token_urlsafe(32)
    atomic_write(path, f"# ragproxy admin panel key; keep it private.\nsecret_key: {key}\n".encode(), 0o600)
    return key, True


def _setup_logging(level, logs_dir=None, rotate=False, shared=False, tag=None):
    """Log to stderr and, with ``logs_dir``, to its rag-proxy.log: rotated (10 MiB x 5) by the
    server, which writes for days; a one-shot command appends its few lines.

    Each record is one line (control characters in logged values are escaped:
    see logfile), and the log file, which may hold request data, is made 0600.
    ``shared``: several processes write the file (serve's workers), so they take
    turns and agree on its rotation; ``tag`` ("worker 1") begins each message.
    """
    import logging

    from .logfile import EscapingFormatter, PrivateFileHandler, PrivateRotatingFileHandler, SharedRotatingFileHandler

    root = logging.getLogger("ragproxy")
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    fmt = EscapingFormatter("%(asctime)s %(levelname)s " + (f"[{tag}] " if tag else "") + "%(message)s")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    root.addHandler(console)
    if logs_dir:
        path = os.path.join(logs_dir, "rag-proxy.log")
        if shared:
            to_file = SharedRotatingFileHandler(path, maxBytes=10 * 1024 * 1024, backupCount=5, encoding="utf-8")
        elif rotate:
            to_file = PrivateRotatingFileHandler(path, maxBytes=10 * 1024 * 1024, backupCount=5, encoding="utf-8")
        else:
            to_file = PrivateFileHandler(path, encoding="utf-8")
        to_file.setFormatter(fmt)
        root.addHandler(to_file)
    root.propagate = False


def _show_secret(message, *args):
    """A new secret, once, on the terminal (stderr) only: formatted as a log line and shown whatever
    the log level, but never written to the log file, which whoever looks after the server reads."""
    import logging

    logger = _log()
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, message, args, None)
    for handler in logger.handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.handle(record)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# Exit statuses (the README lists them): what a script running these commands can tell apart.
EXIT_OK = 0
EXIT_ERROR = 1      # a command failed: a store, file or embedding server error
EXIT_USAGE = 2      # the command cannot run as given: arguments (argparse's own 2), config, data directory
EXIT_DEFERRED = 3   # index finished, but files were deferred (an embedding server failing); retried next run
EXIT_NO_SOURCE = 4  # index finished, but a knowledge base has no readable source at all: nothing to index


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser():
    """The argument parser of every command; each argument and subcommand has help text (a test walks it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help="data directory (RAGPROXY_DATA_DIR, default ./data); made by serve and mcp, and "
                             "by index or import given a --config; search and kb need one that exists")
    common.add_argument("--config", default=argparse.SUPPRESS,
                        help="config file (RAGPROXY_CONFIG, default DATA_DIR/config/config.yaml)")
    common.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper, choices=LOG_LEVELS,
                        help="log level on stderr and in DATA_DIR/logs (RAGPROXY_LOG_LEVEL, server.log_level, "
                             "default INFO)")
    listen = argparse.ArgumentParser(add_help=False)
    listen.add_argument("--host", default=argparse.SUPPRESS, help="listen address (RAGPROXY_HOST, 127.0.0.1)")
    listen.add_argument("--port", type=int, default=argparse.SUPPRESS, help="listen port (RAGPROXY_PORT, 8100)")
    listen.add_argument("--workers", type=_positive_int, default=argparse.SUPPRESS, metavar="N",
                        help="serving processes on the one port (RAGPROXY_WORKERS, server.workers, default 1)")
    parser = argparse.ArgumentParser(
        prog="ragproxy", parents=[common, listen], description="Local knowledge-base proxy for LLM tools.",
        epilog="exit status: 0 done; 1 a command failed; 2 bad arguments, config or data directory; "
               "3 index deferred files (retried next run); 4 a knowledge base has no readable source")
    parser.add_argument("--version", action="store_true", help="print version and active accelerators")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND",
                                help="what to do (default: serve)")
    sub.add_parser("serve", parents=[common, listen], help="run the proxy (the default)",
                   description="Run the proxy, its admin panel and the background indexer.")
    p = sub.add_parser("index", parents=[common], help="bring a knowledge base up to date",
                       description="Index added and changed files; progress on stderr, a summary on stdout. "
                                   "Exit status 3 when files were deferred (retried next run), 4 when a "
                                   "knowledge base has no readable source.")
    p.add_argument("kb", nargs="?", help="knowledge base (default: all)")
    p.add_argument("--full", action="store_true", help="re-read every file, not only changed ones")
    p = sub.add_parser("search", parents=[common], help="search a knowledge base",
                       description="Search one knowledge base and print the ranked hits (no model, no rerank).")
    p.add_argument("kb", help="knowledge base to search")
    p.add_argument("query", help="what to search for (not empty)")
    p.add_argument("--top-k", type=_positive_int, default=None, metavar="N",
                   help="number of hits, at least 1 (default: rag.top_k)")
    p.add_argument("--mode", choices=("lexical", "dense", "hybrid"), default=None,
                   help="retrieval mode (default: the knowledge base's own)")
    p.add_argument("--json", action="store_true", help="one JSON object per hit")
    p = sub.add_parser("kb", parents=[common], help="knowledge base information",
                       description="List the knowledge bases: chunks, files, size, last indexed, source "
                                   "warnings and the files the last index run skipped.")
    p.add_argument("action", choices=("list",), help="list: one row per knowledge base")
    p.add_argument("--json", action="store_true",
                   help="one JSON list, an object per knowledge base, with its sources and skipped files")
    p = sub.add_parser("import", parents=[common], help="add a BEIR-style JSONL corpus to a knowledge base",
                       description="Copy a corpus into the knowledge base's documents folder, then index it.")
    p.add_argument("kb", help="knowledge base to add it to")
    p.add_argument("corpus", help="a .jsonl file of {_id, title, text} lines")
    p = sub.add_parser("mcp", parents=[common], help="serve the knowledge bases as MCP tools to one local client",
                       description="Serve the knowledge bases as MCP tools on stdin and stdout.")
    p.add_argument("--stdio", action="store_true",
                   help="on stdin and stdout, for clients that launch their servers (serve has the HTTP "
                        "endpoint, /mcp)")
    return parser


# Commands that only read a data directory: they create nothing, so a mistyped --data-dir is an error
# rather than a fresh data directory with a new API key.
_READ_ONLY = ("search", "kb")
# Commands that fill a knowledge base: on a data directory that does not exist, only when a config
# file (named on purpose) says what to index.  serve and mcp --stdio start a new one, as a first start.
_INDEXING = ("index", "import")


def _load_settings(opt, environ):
    """Data dir, config path and CLI/env overrides; creates the data dir and a default config.

    ``serve`` and ``mcp`` create a missing data directory (a first start);
    ``index`` and ``import`` do when given a config file (it says what to
    index), and the read-only commands never do.
    """
    from .config import Config, ConfigError
    from .configfile import write_default_config
    from .yamlish import YAMLError

    command = opt.get("command") or "serve"
    data_dir = opt.get("data_dir") or environ.get("RAGPROXY_DATA_DIR") or "./data"
    explicit_config = opt.get("config") or environ.get("RAGPROXY_CONFIG")
    config_path = explicit_config or os.path.join(data_dir, "config", "config.yaml")
    port = opt.get("port")
    if port is None and environ.get("RAGPROXY_PORT"):
        try:
            port = int(environ["RAGPROXY_PORT"])
        except ValueError:
            raise _CLIError(f"RAGPROXY_PORT must be a number, got {environ['RAGPROXY_PORT']!r}") from None
    level = opt.get("log_level") or (environ.get("RAGPROXY_LOG_LEVEL") or "").upper() or None
    if level is not None and level not in LOG_LEVELS:
        raise _CLIError(f"RAGPROXY_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, "
                        f"got {environ['RAGPROXY_LOG_LEVEL']!r}")
    workers = opt.get("workers")
    if workers is None and environ.get("RAGPROXY_WORKERS"):
        try:
            workers = _positive_int(environ["RAGPROXY_WORKERS"])
        except argparse.ArgumentTypeError as exc:
            raise _CLIError(f"RAGPROXY_WORKERS {exc}") from None
    overrides = {"server.host": opt.get("host") or environ.get("RAGPROXY_HOST"), "server.port": port,
                 "server.log_level": level, "server.workers": workers}
    if not os.path.isdir(data_dir) and (command in _READ_ONLY or (command in _INDEXING and not explicit_config)):
        hint = "a config file with --config to create it" if command in _INDEXING else \
            "'ragproxy.py serve' or 'ragproxy.py index --config FILE' to create one"
        raise _CLIError(f"data directory {data_dir} does not exist (check --data-dir and RAGPROXY_DATA_DIR, "
                        f"or use {hint}); nothing was created")
    if command in _READ_ONLY:
        if not os.path.exists(config_path):
            raise _CLIError(f"no config file {config_path} (check --data-dir and --config; 'ragproxy.py serve' "
                            "writes a default one); nothing was created")
    else:
        try:
            _prepare_data_dir(data_dir)
        except OSError as exc:
            raise _CLIError(f"cannot create data directory {data_dir}: {exc}") from None
    serving = command == "serve"
    logs_dir = os.path.join(data_dir, "logs")
    logs_dir = logs_dir if os.path.isdir(logs_dir) else None
    _setup_logging(level or "INFO", logs_dir, serving)
    created_key = None
    if not os.path.exists(config_path):
        if explicit_config:
            raise _CLIError(f"config file {config_path} does not exist")
        created_key = write_default_config(config_path)
    try:
        config = Config.load(config_path, environ=environ, overrides=overrides)
    except (ConfigError, YAMLError) as exc:
        raise _CLIError(f"invalid configuration, not starting:\n{exc}") from None
    _setup_logging(config.server["log_level"], logs_dir, serving)
    if created_key:
        _log().info("wrote a default config to %s with a new client key in api_keys (shown on the terminal "
                    "only)", config_path)
        _show_secret("clients authenticate with the API key %s (shown once; also in %s)", created_key, config_path)
    return data_dir, config_path, overrides, config


class _CLIError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2 (EXIT_USAGE)."""


def main(argv=None, environ=None):
    """Entry point of ``python ragproxy.py``; returns the exit status."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(version_text())
        return 0
    opt = vars(args)
    command = args.command or "serve"
    _setup_logging("INFO")  # to stderr, for what goes wrong before the config says more
    try:
        channel = None
        if command == "mcp":
            if not args.stdio:
                raise _CLIError("mcp serves on stdin and stdout: run 'ragproxy.py mcp --stdio' (over HTTP, MCP "
                                "clients use http://HOST:PORT/mcp of 'ragproxy.py serve')")
            channel = _claim_stdout()  # first: nothing below may write where the client reads
        data_dir, config_path, overrides, config = _load_settings(opt, environ)
        if command == "serve":
            return _serve(data_dir, config_path, overrides, config, environ)
        if command == "mcp":
            return _mcp_stdio(data_dir, config, channel)
        from .knowledgebases import KnowledgeBases

        kbs = KnowledgeBases(config, data_dir)
        return _KB_COMMANDS[command](args, kbs)
    except _CLIError as exc:
        # One record per line: a log line cannot hold a newline (see logfile), and a
        # config error lists one problem per line.
        for line in str(exc).splitlines() or [""]:
            _log().error("%s", line)
        return EXIT_USAGE
    except Exception as exc:
        if not isinstance(exc, _reported_errors()):
            raise
        _log().error("%s: %s", command, exc)
        return EXIT_ERROR


def _reported_errors():
    """What a command reports in one line (exit status 1) rather than as a traceback."""
    from .npy import StoreError

    known = (StoreError, OSError, ValueError)
    # Only a command that loaded the embedding client can meet its errors; importing it
    # here just to name them would cost every lexical command the HTTP client.
    embeddings = sys.modules.get(__package__ + ".embeddings")
    return known + (embeddings.EmbeddingError,) if embeddings is not None else known


def _kb_or_fail(kbs, name):
    kb = kbs.get(name)
    if kb is None:
        known = ", ".join(sorted(kbs.kbs)) or "none"
        raise _CLIError(f"no knowledge base {name!r} in the config (configured: {known})")
    return kb


def _duration(seconds):
    if seconds < 59.5:
        return f"{round(seconds)}s"
    if seconds < 3570:
        seconds = round(seconds)
        return f"{seconds // 60}m{seconds % 60:02d}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


class IndexProgress:
    """``index``'s progress callback: files done/total, chunks so far, files/s and an ETA on ``stream``.

    On a terminal it is one line redrawn in place (at most every ``redraw``
    seconds); elsewhere (a log file, CI) a line when the run starts, then
    every ``every`` seconds and at the last file, never one per file.  The
    chunk count is read from the knowledge base's ``status`` as the run
    goes; ``clock`` is injectable so the rate and ETA can be tested.
    """

    def __init__(self, name, stream, interactive, status=None, clock=None, every=10.0, redraw=0.2):
        import time

        self.name, self.stream, self.interactive = name, stream, interactive
        self.status = status if status is not None else {}
        self.clock = clock or time.monotonic
        self.every, self.redraw = every, redraw
        self.started = self.clock()
        self.last = None
        self.width = 0
        self.open_line = False  # a terminal line not yet ended with a newline

    def __call__(self, done, total, source):
        now = self.clock()
        final = done >= total
        if self.last is not None and not final and now - self.last < (self.redraw if self.interactive else self.every):
            return
        self.last = now
        line = self.line(done, total, now)
        if self.interactive:
            # Spaces over what a longer previous line left behind; no terminal escapes needed.
            self.stream.write("\r" + line + " " * max(0, self.width - len(line)) + ("\n" if final else ""))
            self.width, self.open_line = len(line), not final
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def line(self, done, total, now):
        parts = [f"[{self.name}] {done}/{total} files ({100 * done // max(total, 1)}%)"]
        if self.status.get("chunks") is not None:
            parts.append(f"{self.status['chunks']} chunks")
        elapsed = now - self.started
        if elapsed >= 1.0 and done:   # a rate over less than a second says little
            rate = done / elapsed
            parts.append(f"{rate:.1f} files/s" if rate < 100 else f"{rate:.0f} files/s")
            parts.append(f"ETA {_duration((total - done) / rate)}" if done < total else f"{_duration(elapsed)} so far")
        return ", ".join(parts)

    def close(self):
        """End a terminal line left open by a run that stopped early, so what follows starts on its own line."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False


def _cmd_index(args, kbs):
    targets = [_kb_or_fail(kbs, args.kb)] if args.kb else list(kbs.kbs.values())
    interactive = sys.stderr.isatty()
    status = EXIT_OK
    for kb in targets:
        progress = IndexProgress(kb.spec.name, sys.stderr, interactive, kb.status)
        try:
            report = kb.index(full=args.full, progress=progress)
        finally:
            progress.close()
        print(report.summary())
        for source, reason in report.skipped:
            print(f"  skipped {source}: {reason}")
        for source, reason in report.deferred:
            print(f"  deferred {source}: {reason}")
        # The indexer has logged each source problem as it found it; what is left is the verdict.
        if kb.readable_source_count(report.sources) == 0:   # the run's own walk, not a second one
            _log().error("%s: no readable source, nothing was indexed (kb list shows each source's state)",
                         kb.spec.name)
            status = max(status, EXIT_NO_SOURCE)
        elif report.deferred:
            _log().error("%s: %d files deferred; the next index run retries them", kb.spec.name,
                         len(report.deferred))
            status = max(status, EXIT_DEFERRED)
    return status


def _cmd_search(args, kbs):
    import json

    from .inject import line_range

    kb = _kb_or_fail(kbs, args.kb)
    if not args.query.strip():
        raise _CLIError("search: the query is empty; give the words to search for, e.g. "
                        f"ragproxy.py search {args.kb} \"retry policy\"")
    hits = kb.search(args.query, args.top_k or kbs.config.rag["top_k"], mode=args.mode)
    for rank, hit in enumerate(hits, 1):
        c = hit.chunk
        lines = line_range(c)  # as injected chunks are labelled: "362-389", "12", or none (a JSONL record)
        where = f"{c['source']}:{lines}" if lines else c["source"]
        if args.json:
            print(json.dumps({"rank": rank, "id": hit.id, "score": hit.score, "scores": hit.scores,
                              "source": c["source"], "line_start": c.get("line_start"),
                              "line_end": c.get("line_end"), "title": c.get("title", ""),
                              "symbol": c.get("symbol", ""), "text": c.get("text", "")}, ensure_ascii=False))
        else:
            scores = " ".join(f"{k}={v:.4f}" for k, v in hit.scores.items())
            print(f"{rank:2d}. {hit.id}  {where}  {scores}")
            label = c.get("symbol") or " > ".join(c.get("headings") or []) or c.get("title", "")
            if label:
                print(f"    {label}")
    if not hits and not args.json:
        print("no match")
    return EXIT_OK


def _kb_list_entry(kb):
    """One knowledge base as ``kb list --json`` shows it (the README lists the keys)."""
    from .files import iso_utc

    stats = kb.stats()
    return {"name": stats["name"], "retrieval": stats["retrieval"], "files": stats["files"],
            "chunks": stats["chunks"], "bytes": stats["bytes"], "generation": stats["generation"],
            "last_indexed": iso_utc(stats["last_indexed"]), "sources": stats["sources"],
            "warnings": stats["warnings"], "skipped": stats["skipped"], "deferred": stats["deferred"]}


def _cmd_kb(args, kbs):
    import json

    from .files import human_size

    entries = [_kb_list_entry(kbs.kbs[name]) for name in sorted(kbs.kbs)]
    if args.json:
        print(json.dumps(entries, indent=2, ensure_ascii=False))
        return EXIT_OK
    rows = [("name", "retrieval", "chunks", "files", "size", "last indexed (UTC)")]
    for e in entries:
        rows.append((e["name"], e["retrieval"], str(e["chunks"]), str(e["files"]), human_size(e["bytes"]),
                     (e["last_indexed"] or "never").replace("T", " ").rstrip("Z")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for e in entries:
        for warning in e["warnings"]:
            print(f"{e['name']}: warning: {warning}")
        for key, then in (("skipped", ""), ("deferred", ", to be retried next run")):
            if e[key]:
                print(f"{e['name']}: {len(e[key])} file{'s' if len(e[key]) != 1 else ''} {key} by the last "
                      f"index run{then} (kb list --json names them and why)")
    return EXIT_OK


def _cmd_import(args, kbs):
    from .files import atomic_write

    kb = _kb_or_fail(kbs, args.kb)
    if not args.corpus.endswith(".jsonl"):
        raise _CLIError("import takes a .jsonl corpus ({_id, title, text} per line)")
    os.makedirs(kb.documents_dir, exist_ok=True)
    target = os.path.join(kb.documents_dir, os.path.basename(args.corpus))
    with open(args.corpus, "rb") as f:
        atomic_write(target, f.read())
    print(f"copied {args.corpus} to {target}")
    return _cmd_index(argparse.Namespace(kb=args.kb, full=False), kbs)


def _claim_stdout():
    """The process's standard output, for MCP messages alone (a binary stream).

    File descriptor 1 and sys.stdout are pointed at stderr from here on, so
    that no print, warning or child process can put anything else where the
    client reads messages.
    """
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (an embedding program's stream)
        channel = getattr(sys.stdout, "buffer", sys.stdout)
    else:
        channel = os.fdopen(os.dup(fd), "wb")
        os.dup2(sys.stderr.fileno(), fd)
    sys.stdout = sys.stderr
    return channel


def _mcp_stdio(data_dir, config, channel):
    """``mcp --stdio``: the MCP tools for the local user who launched it, on stdin and stdout.

    It indexes nothing: it answers from the knowledge bases as committed on
    disk (a ``serve`` process may be indexing them meanwhile), and says which
    ones were never indexed.  No API key: whoever can launch it owns the data
    directory.
    """
    from .mcp import McpServer, serve_stdio
    from .proxy import App

    app = App(config, data_dir=data_dir)
    server = McpServer(app, indexer=False)
    _log().info("ragproxy %s serving MCP on stdio; knowledge bases: %s", __version__,
                ", ".join(app.readable_kbs(None)) or "none")
    try:
        serve_stdio(server, sys.stdin.buffer, channel)
    except (KeyboardInterrupt, BrokenPipeError):  # the client stopped us, or went away
        pass
    finally:
        app.close()
    return 0


_KB_COMMANDS = {"index": _cmd_index, "search": _cmd_search, "kb": _cmd_kb, "import": _cmd_import}


# The serving process's cyclic garbage collector runs once this many more container objects
# are alive than at its last run (Python's default is 700; the older generations keep theirs).
# A request's objects are freed by reference counting as it ends, and none form cycles, but
# each one's results live on in the retrieval caches: at 700 the collector ran every few
# requests and promoted them, and the older generations' runs walked the caches again and
# again.  Measured in process (chat body, a new question each request, 80k chunks): the
# collector cost 18-20 us a request at 700, 3-5 at 10,000, 25-30 us of CPU a request at 8
# threads.  A few thousand objects more wait for a run: well under a megabyte.
SERVE_GC_THRESHOLD = 10_000


# How long a thread that took the GIL may keep it while another waits (Python's default is 5 ms).
# BM25's numpy operations let the GIL go around each operation on more than a few hundred
# entries; another connection's thread takes it and runs, and the search, which holds the lock
# every other search waits on, may wait that long to go on.  Measured in interleaved A/Bs (bench/
# proxy_overhead.py --compare, a new question each request on the chat body, 80k chunks, session
# 25): p50 lower in 14 of 18 paired runs at 8 and 16 clients, by 0.7-0.9 ms on average of 6-15 ms;
# the Claude Code body and pass-through moved both ways, within their scatter; 1 ms gained less.
SERVE_SWITCH_INTERVAL = 0.0005


# How long a stopping server waits for the indexer thread to end.  A daemon thread still inside
# C++ code (numpy's import, which the indexer starts with, or its sorts) when the interpreter
# finalizes is ended by a forced unwind that C++ answers with std::terminate: the process then
# exits -6 on SIGTERM, "terminate called without an active exception" (seen in CI on a stop
# 60 ms after start-up, and in sessions 10 and 18).
INDEXER_STOP_WAIT = 10.0


def _stop_indexer(knowledge_bases):
    if knowledge_bases is None:
        return
    knowledge_bases.stop(wait=INDEXER_STOP_WAIT)
    if knowledge_bases.indexer_running():
        _log().warning("the indexer is still running after %.0f s; exiting without it", INDEXER_STOP_WAIT)


def _serve(data_dir, config_path, overrides, config, environ):
    """Serve in this process, or (server.workers > 1) as a supervisor of that many worker processes."""
    from .admin import remove_deleted_kbs
    from .config import ConfigError, describe_models
    from .server import listening_socket
    from .uploads import cleanup_staging
    from .yamlish import YAMLError

    _hold_data_dir(data_dir)
    try:
        secret_key, secret_created = _load_secret_key(data_dir, environ)
    except (ConfigError, YAMLError) as exc:
        raise _CLIError(str(exc)) from None
    for name in cleanup_staging(os.path.join(data_dir, "documents")):
        _log().info("removed %s, left by an upload that did not finish", name)
    for path in remove_deleted_kbs(data_dir):
        _log().info("removed %s, left by a knowledge base deletion that did not finish", path)
    host, port, workers = config.server["host"], config.server["port"], config.server["workers"]
    if workers > 1 and not hasattr(os, "fork"):
        raise _CLIError(f"server.workers is {workers}, but this system cannot fork worker processes: "
                        "set it to 1")
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        raise _CLIError(f"cannot listen on {host}:{port}: {exc}") from None
    if secret_created:
        secret_path = os.path.join(data_dir, "config", "secret_key.yaml")
        _log().info("created the admin panel key in %s (shown on the terminal only)", secret_path)
        _show_secret("admin panel key (shown once; also in %s): %s", secret_path, secret_key)
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    serving = _ServeContext(data_dir, config_path, overrides, config, environ, secret_key, sock)
    if workers == 1:
        # Before "listening on": whoever reads that line (a supervisor, a test) may signal at once,
        # and a SIGTERM must still shut down cleanly, not kill; run() sets the handlers first.
        return serving.run(announce=lambda: _log().info(
            "ragproxy %s listening on http://%s:%d (%s); web panel at http://%s:%d/", __version__, shown_host,
            port, describe_models(config), shown_host, port))
    return _supervise(serving, workers, lambda: _log().info(
        "ragproxy %s listening on http://%s:%d with %d worker processes (%s); web panel at http://%s:%d/",
        __version__, shown_host, port, workers, describe_models(config), shown_host, port))


def _supervise(serving, workers, announce):
    from .metricsshare import MetricsShare
    from .workers import STATUS_FILE, Supervisor

    run_dir = serving.run_dir()
    # A slot's worker starts from its predecessor's counts; an earlier run's are not its predecessors.
    MetricsShare.clear(os.path.join(run_dir, "metrics"))
    logs_dir = os.path.join(serving.data_dir, "logs")
    # Several processes write one log file: rotation must be agreed on (see logfile).
    _setup_logging(serving.config.server["log_level"], logs_dir if os.path.isdir(logs_dir) else None, True,
                   shared=True)
    supervisor = Supervisor(serving.run_worker, workers, os.path.join(run_dir, STATUS_FILE))
    announce()
    try:
        return supervisor.run()
    finally:
        serving.sock.close()
        _log().info("ragproxy stopped")


def _run_dir(data_dir):
    """DATA_DIR/run, made if missing: the serve lock, and what workers share (their status, metrics,
    throttle, the indexer's queue)."""
    path = os.path.join(data_dir, "run")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _hold_data_dir(data_dir):
    """Lock the data directory for this serve's life (DATA_DIR/run/serve.lock), or refuse to start.

    A second serve on it would index beside the first one's indexer, write its key file if the first
    took its key from the environment, and with workers write over the first one's workers' metrics.
    The lock is held by an open file, so it goes with the last of this serve's processes, however
    they end.
    """
    try:
        import fcntl
    except ImportError:  # no flock here (Windows): nothing to hold it with
        return None
    path = os.path.join(_run_dir(data_dir), "serve.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise _CLIError(f"another 'ragproxy serve' is running on the data directory {data_dir} ({path} is "
                        "locked); one data directory serves one proxy") from None
    return fd


class _ServeContext:
    """What serve's process, or each of its workers, builds a whole ragproxy from."""

    def __init__(self, data_dir, config_path, overrides, config, environ, secret_key, sock):
        self.data_dir, self.config_path, self.overrides = data_dir, config_path, overrides
        self.config, self.environ, self.secret_key, self.sock = config, environ, secret_key, sock

    def run_dir(self):
        return _run_dir(self.data_dir)

    def run_worker(self, slot, ready):
        """One worker process's whole life, in the child the supervisor forked; its exit status.
        ``ready()`` tells the supervisor it serves."""
        logs_dir = os.path.join(self.data_dir, "logs")
        _setup_logging(self.config.server["log_level"], logs_dir if os.path.isdir(logs_dir) else None, True,
                       shared=True, tag=f"worker {slot}")
        return self.run(slot=slot, announce=ready)

    def run(self, slot=None, announce=None):
        """Serve until SIGTERM or SIGINT; 0.  ``slot``: this worker's, under a supervisor (None: alone)."""
        import gc
        import signal
        import threading

        from .admin import Admin
        from .configfile import ConfigFile, ConfigWatcher
        from .placement import CpuPlacement
        from .proxy import App
        from .server import make_server

        gc.set_threshold(SERVE_GC_THRESHOLD, *gc.get_threshold()[1:])
        sys.setswitchinterval(SERVE_SWITCH_INTERVAL)
        app = App(self.config, data_dir=self.data_dir)
        app.placement = placement = CpuPlacement(self.config.server["cpu_pinning"], slot or 0)
        app.metrics.add_collector(placement.samples)
        config_file = ConfigFile(self.config_path, environ=self.environ, overrides=self.overrides)
        stopping = threading.Event()
        shared = self._share(app, slot, stopping) if slot is not None else {}
        app.admin = Admin(app, self.secret_key, config_file, **shared)
        server = make_server(app, sock=self.sock, placement=placement)
        watcher = ConfigWatcher(app, config_file)
        threading.Thread(target=watcher.run, name="config-watcher", daemon=True).start()
        app.knowledge_bases.start()
        _log().info("%s", placement.describe())
        if placement.cpu is not None:
            threading.Thread(target=placement.run, args=(stopping,), name="cpu-placement", daemon=True).start()

        def stop(*_):
            if not stopping.is_set():
                stopping.set()
                threading.Thread(target=server.shutdown, daemon=True).start()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            # A worker's Ctrl-C is the supervisor's to act on (it sends SIGTERM): a worker ending on
            # the terminal's SIGINT before its supervisor had seen it would be taken for a crash.
            signal.signal(signal.SIGINT, stop if slot is None else signal.SIG_IGN)
            if hasattr(signal, "SIGHUP"):
                signal.signal(signal.SIGHUP, watcher.request_reload)
        if announce is not None:
            announce()
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            stopping.set()
            watcher.stop()
            server.server_close()
            _stop_indexer(app.knowledge_bases)
            if app.metrics.share is not None:
                app.metrics.share.flush()
            app.close()
            _log().info("ragproxy stopped" if slot is None else "worker stopped")
        return 0

    def _share(self, app, slot, stopping):
        """Wire a worker's App to its siblings': what they share; Admin's keyword arguments."""
        import hashlib
        import hmac
        import threading

        from .admintokens import SharedLoginThrottle
        from .metricsshare import MetricsShare
        from .workers import STATUS_FILE

        run_dir = self.run_dir()
        app.knowledge_bases.share_indexer(run_dir, owner=slot == 0)
        app.mcp_session_secret = hmac.new(self.secret_key.encode("utf-8"), b"ragproxy mcp session ids",
                                          hashlib.sha256).digest()
        app.metrics.share = MetricsShare(os.path.join(run_dir, "metrics"), slot)
        threading.Thread(target=app.metrics.share.run, args=(stopping,), name="metrics-share", daemon=True).start()
        app.worker = {"slot": slot, "status_path": os.path.join(run_dir, STATUS_FILE)}
        return {"throttle": SharedLoginThrottle(os.path.join(run_dir, "login-throttle.sqlite3"), app.clock)}


if __name__ == "__main__":
    sys.exit(main())
