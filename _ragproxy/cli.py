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


def _setup_logging(level, logs_dir=None, rotate=False):
    """Log to stderr and, with ``logs_dir``, to its rag-proxy.log: rotated (10 MiB x 5) by the
    server, which writes for days; a one-shot command appends its few lines.

    Each record is one line (control characters in logged values are escaped:
    see logfile), and the log file, which may hold request data, is made 0600.
    """
    import logging

    from .logfile import EscapingFormatter, PrivateFileHandler, PrivateRotatingFileHandler

    root = logging.getLogger("ragproxy")
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    fmt = EscapingFormatter("%(asctime)s %(levelname)s %(message)s")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    root.addHandler(console)
    if logs_dir:
        path = os.path.join(logs_dir, "rag-proxy.log")
        if rotate:
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


def _parse_args(argv):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, help="data directory (RAGPROXY_DATA_DIR, ./data)")
    common.add_argument("--config", default=argparse.SUPPRESS,
                        help="config file (RAGPROXY_CONFIG, DATA_DIR/config/config.yaml)")
    common.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="RAGPROXY_LOG_LEVEL, INFO")
    listen = argparse.ArgumentParser(add_help=False)
    listen.add_argument("--host", default=argparse.SUPPRESS, help="listen address (RAGPROXY_HOST, 127.0.0.1)")
    listen.add_argument("--port", type=int, default=argparse.SUPPRESS, help="listen port (RAGPROXY_PORT, 8100)")
    parser = argparse.ArgumentParser(prog="ragproxy", parents=[common, listen],
                                     description="Local knowledge-base proxy for LLM tools.")
    parser.add_argument("--version", action="store_true", help="print version and active accelerators")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", parents=[common, listen], help="run the proxy (the default)")
    p = sub.add_parser("index", parents=[common], help="bring a knowledge base up to date")
    p.add_argument("kb", nargs="?", help="knowledge base (default: all)")
    p.add_argument("--full", action="store_true", help="re-read every file, not only changed ones")
    p = sub.add_parser("search", parents=[common], help="search a knowledge base")
    p.add_argument("kb")
    p.add_argument("query")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--mode", choices=("lexical", "dense", "hybrid"), default=None)
    p.add_argument("--json", action="store_true", help="one JSON object per hit")
    p = sub.add_parser("kb", parents=[common], help="knowledge base information")
    p.add_argument("action", choices=("list",))
    p = sub.add_parser("import", parents=[common], help="add a BEIR-style JSONL corpus to a knowledge base")
    p.add_argument("kb")
    p.add_argument("corpus", help="a .jsonl file of {_id, title, text} lines")
    p = sub.add_parser("mcp", parents=[common], help="serve the knowledge bases as MCP tools to one local client")
    p.add_argument("--stdio", action="store_true",
                   help="on stdin and stdout, for clients that launch their servers (serve has the HTTP "
                        "endpoint, /mcp)")
    return parser.parse_args(argv)


def _load_settings(opt, environ):
    """Data dir, config path and CLI/env overrides; creates the data dir and a default config."""
    from .config import Config, ConfigError, write_default_config
    from .yamlish import YAMLError

    data_dir = opt.get("data_dir") or environ.get("RAGPROXY_DATA_DIR") or "./data"
    config_path = opt.get("config") or environ.get("RAGPROXY_CONFIG") or \
        os.path.join(data_dir, "config", "config.yaml")
    port = opt.get("port")
    if port is None and environ.get("RAGPROXY_PORT"):
        try:
            port = int(environ["RAGPROXY_PORT"])
        except ValueError:
            raise _CLIError(f"RAGPROXY_PORT must be a number, got {environ['RAGPROXY_PORT']!r}") from None
    overrides = {"server.host": opt.get("host") or environ.get("RAGPROXY_HOST"), "server.port": port,
                 "server.log_level": opt.get("log_level") or (environ.get("RAGPROXY_LOG_LEVEL") or "").upper()
                 or None}
    try:
        _prepare_data_dir(data_dir)
    except OSError as exc:
        raise _CLIError(f"cannot create data directory {data_dir}: {exc}") from None
    serving = (opt.get("command") or "serve") == "serve"
    _setup_logging(overrides["server.log_level"] or "INFO", os.path.join(data_dir, "logs"), serving)
    created_key = None
    if not os.path.exists(config_path):
        if opt.get("config") or environ.get("RAGPROXY_CONFIG"):
            raise _CLIError(f"config file {config_path} does not exist")
        created_key = write_default_config(config_path)
    try:
        config = Config.load(config_path, environ=environ, overrides=overrides)
    except (ConfigError, YAMLError) as exc:
        raise _CLIError(f"invalid configuration, not starting:\n{exc}") from None
    _setup_logging(config.server["log_level"], os.path.join(data_dir, "logs"), serving)
    if created_key:
        _log().info("wrote a default config to %s with a new client key in api_keys (shown on the terminal "
                    "only)", config_path)
        _show_secret("clients authenticate with the API key %s (shown once; also in %s)", created_key, config_path)
    return data_dir, config_path, overrides, config


class _CLIError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""


def main(argv=None, environ=None):
    """Entry point of ``python ragproxy.py``; returns the exit status."""
    environ = os.environ if environ is None else environ
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(version_text())
        return 0
    opt = vars(args)
    command = args.command or "serve"
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
        from .kb import KnowledgeBases

        kbs = KnowledgeBases(config, data_dir)
        return _KB_COMMANDS[command](args, kbs)
    except _CLIError as exc:
        # One record per line: a log line cannot hold a newline (see logfile), and a
        # config error lists one problem per line.
        for line in str(exc).splitlines() or [""]:
            _log().error("%s", line)
        return 2
    except Exception as exc:
        if not isinstance(exc, _reported_errors()):
            raise
        _log().error("%s: %s", command, exc)
        return 1


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


def _cmd_index(args, kbs):
    import time

    targets = [_kb_or_fail(kbs, args.kb)] if args.kb else list(kbs.kbs.values())
    interactive = sys.stderr.isatty()
    for kb in targets:
        last = [0.0]

        def progress(done, total, source, kb=kb):
            now = time.monotonic()
            if now - last[0] >= 0.5 or done == total:
                last[0] = now
                end = "\r" if interactive and done < total else "\n"
                sys.stderr.write(f"[{kb.spec.name}] {done}/{total} files{end}")
                sys.stderr.flush()

        report = kb.index(full=args.full, progress=progress)
        print(report.summary())
        for source, reason in report.skipped:
            print(f"  skipped {source}: {reason}")
        for source, reason in report.deferred:
            print(f"  deferred {source}: {reason}")
    return 0


def _cmd_search(args, kbs):
    import json

    kb = _kb_or_fail(kbs, args.kb)
    hits = kb.search(args.query, args.top_k or kbs.config.rag["top_k"], mode=args.mode)
    for rank, hit in enumerate(hits, 1):
        c = hit.chunk
        where = f"{c['source']}:{c.get('line_start', 0)}-{c.get('line_end', 0)}"
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
    return 0


def _cmd_kb(args, kbs):
    import time

    from .files import human_size

    rows = [("name", "retrieval", "chunks", "files", "size", "last indexed")]
    for name in sorted(kbs.kbs):
        stats = kbs.kbs[name].stats()
        generation = kbs.kbs[name].store.current()
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(generation.dir).st_mtime)) \
            if generation else "never"
        rows.append((name, stats["retrieval"], str(stats["chunks"]), str(stats["files"]),
                     human_size(stats["bytes"]), when))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


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


def _serve(data_dir, config_path, overrides, config, environ):
    import signal
    import threading

    from .admin import Admin, remove_deleted_kbs
    from .config import ConfigError, ConfigFile, ConfigWatcher, describe_models
    from .proxy import App
    from .server import make_server
    from .uploads import cleanup_staging
    from .yamlish import YAMLError

    try:
        secret_key, secret_created = _load_secret_key(data_dir, environ)
    except (ConfigError, YAMLError) as exc:
        raise _CLIError(str(exc)) from None
    for name in cleanup_staging(os.path.join(data_dir, "documents")):
        _log().info("removed %s, left by an upload that did not finish", name)
    for path in remove_deleted_kbs(data_dir):
        _log().info("removed %s, left by a knowledge base deletion that did not finish", path)
    app = App(config, data_dir=data_dir)
    config_file = ConfigFile(config_path, environ=environ, overrides=overrides)
    app.admin = Admin(app, secret_key, config_file)
    try:
        server = make_server(app, config.server["host"], config.server["port"])
    except OSError as exc:
        raise _CLIError(f"cannot listen on {config.server['host']}:{config.server['port']}: {exc}") from None
    if secret_created:
        secret_path = os.path.join(data_dir, "config", "secret_key.yaml")
        _log().info("created the admin panel key in %s (shown on the terminal only)", secret_path)
        _show_secret("admin panel key (shown once; also in %s): %s", secret_path, secret_key)
    watcher = ConfigWatcher(app, config_file)
    threading.Thread(target=watcher.run, name="config-watcher", daemon=True).start()
    app.knowledge_bases.start()
    host, port = server.server_address[:2]
    shown_host = f"[{host}]" if ":" in host else host
    _log().info("ragproxy %s listening on http://%s:%d (%s); web panel at http://%s:%d/", __version__, shown_host,
             port, describe_models(config), shown_host, port)
    stopping = threading.Event()

    def stop(*_):
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, watcher.request_reload)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        watcher.stop()
        server.server_close()
        app.close()
        _log().info("ragproxy stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
