"""config.yaml on disk: the commented default file, validated atomic writes, and reloads.

write_default_config writes the file a first start creates (DEFAULT_CONFIG_TEMPLATE,
with a fresh API key, mode 0600).  ConfigFile reads and writes it: every write
(the admin API's) is validated first, atomic, and keeps the previous file as
.bak, so an invalid change is never written and a crash leaves the old file or
the new one.  ConfigWatcher reloads it when it changes or on SIGHUP, and keeps
the running config when the new file is invalid.  What a config means (schema,
validation, Config) is ``config``'s.

May import: config, files, yamlish.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

from .config import Config, ConfigError, describe_models, parse_config_text
from .files import atomic_write
from .yamlish import dump_yaml

log = logging.getLogger("ragproxy")

DEFAULT_CONFIG_TEMPLATE = """\
# ragproxy configuration.  Written on first start; edit freely: the proxy
# reloads this file when it changes (or on SIGHUP) and keeps running on the old
# settings if the new file is invalid.  ${VAR} and ${VAR:-default} are replaced
# from the environment.

server:
  host: 127.0.0.1          # any other address needs api_key_auth and api_keys
  port: 8100
  max_body_bytes: 33554432 # 32 MiB; larger request bodies get 413
  client_timeout: 300      # seconds a client connection may sit idle
  head_timeout: 10         # seconds for a request's whole head to arrive
  max_connections: 512     # more get 503; GET /health still answers
  reload_interval: 2       # seconds between config file checks

# Clients send one of these keys as "Authorization: Bearer KEY" or "x-api-key".
# The key is never forwarded upstream; each provider sends its own api_key.
api_key_auth: true
api_keys:
  - @@API_KEY@@

providers:
  # LLM servers.  type: openai (base_url includes /v1), anthropic or ollama
  # (base_url is the server root), exactly what each vendor's SDK takes.
  llm:
    ollama:
      type: ollama
      base_url: http://127.0.0.1:11434
      api_key: ""
      connect_timeout: 10
      read_timeout: 600
    # A company gateway over https whose certificate comes from its own
    # authority: trust that authority's PEM file (tls_verify: false would
    # switch every check off).  client_cert and client_key answer a gateway
    # that asks for a client certificate.
    # gateway:
    #   type: openai
    #   base_url: https://llm.corp.example/v1
    #   api_key: ${GATEWAY_KEY}
    #   ca_file: /etc/pki/tls/certs/corp-ca.pem
  embedding: {}
  rerank: {}

# Which provider serves which model.  name may be a glob ("claude-*"); exact
# names win over globs and "*" catches everything else.
models:
  - name: "*"
    upstream: ollama
    kb: [docs]             # null: no retrieval; a name not declared below is a KB over documents/<name>/
    # compression: on      # off (default) | on | a profile below; X-Compression: picks per request
    # context_window: 32768  # for window_fit (Ollama: its num_ctx); else the known-window table

# Knowledge bases.  Each also owns DATA_DIR/documents/<name>/; drop files
# there (or list more sources) and they are indexed within index_interval.
# retrieval: lexical needs no model; dense and hybrid need providers.embedding.
knowledge_bases:
  docs:
    sources: []            # directories, files or globs; relative to DATA_DIR
    retrieval: lexical

rag:
  top_k: 5
  max_context_tokens: 2000
  score_threshold: 0
  rerank_top_k: 20
  query_source: last_user
  on_failure: degrade      # degrade | fail_closed | use_stale
  timeout_ms: 5000         # the whole retrieval of one request; then on_failure applies
  index_interval: 30       # seconds between checks of the sources for changes

vectorstore:
  type: simple             # simple: the built-in store (DATA_DIR/vectordb/); chroma_http: a running Chroma
                           # server, for large or shared KBs (a KB's own vectorstore: key picks per KB)
  # chroma_http:
  #   base_url: "http://chroma:8000"   # ragproxy talks to it (HTTP API v2); it never starts one
  #   tenant: "default_tenant"
  #   database: "default_database"
  #   collection_prefix: "ragproxy_"
  #   indexer: auto                    # auto: one process holds a lease in Chroma and indexes | always | never
  #   token: ${CHROMA_TOKEN}           # sent as X-Chroma-Token, if the server wants one

# Compression levers (README "Compression"): used only by models or requests
# that ask for them.
# compression:
#   levers: [{name: rag_select, max_chunks: 8}, compact_serialization, position_reorder, window_fit]
#   profiles:
#     agent: {levers: [window_fit]}
#   state: {backend: sqlite}   # summary_buffer's sessions; redis (with redis_url) for several replicas

security:
  log_query: false

# The web panel at http://HOST:PORT/ logs in with the key in
# config/secret_key.yaml (or RAGPROXY_SECRET_KEY).
admin:
  token_ttl: 43200         # seconds a panel login lasts

# Caps on panel uploads, checked while the upload arrives and while archives
# (zip, tar, tar.gz) are unpacked.
uploads:
  max_file_bytes: 104857600      # 100 MiB per file
  max_files: 500
  max_total_bytes: 2147483648    # 2 GiB per upload
  max_ratio: 200                 # unpacked/packed size: refuses zip bombs
"""


def write_default_config(path, rng=None):
    """Create a commented default config with a fresh API key; returns that key.

    ``rng`` (default: the secrets module) makes the key: ``rng.token_urlsafe(24)``.
    """
    if rng is None:
        import secrets as rng
    key = "rp-" + rng.token_urlsafe(24)
    atomic_write(path, DEFAULT_CONFIG_TEMPLATE.replace("@@API_KEY@@", key).encode("utf-8"), mode=0o600)
    return key


class ConfigFile:
    """config.yaml on disk: loading, validated writes with a backup, change detection.

    Writes (the admin API's) are serialized and validated before they touch
    the file; the previous file is kept as ``<path>.bak``.  ``${VAR}``
    references are edited as written, never replaced by their values.
    """

    HEADER = ("ragproxy configuration, last written by the admin API.\n"
              "The previous version of this file is kept beside it as config.yaml.bak.")

    def __init__(self, path, environ=None, overrides=None):
        self.path = path
        self.environ = os.environ if environ is None else environ
        self.overrides = overrides or {}
        self.lock = threading.RLock()
        self._stamp = self._file_stamp()

    def _file_stamp(self):
        try:
            st = os.stat(self.path)
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            return None

    def changed(self):
        """True once per change of the file made by someone else."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def load(self):
        self._stamp = self._file_stamp()
        return Config.load(self.path, environ=self.environ, overrides=self.overrides)

    def read_text(self):
        with open(self.path, encoding="utf-8") as f:
            return f.read()

    def validate(self, text):
        return Config.from_text(text, source=os.path.basename(self.path), environ=self.environ,
                                overrides=self.overrides)

    def write(self, text):
        """Validate ``text``, back up the current file, replace it; the new Config."""
        with self.lock:
            config = self.validate(text)
            with contextlib.suppress(FileNotFoundError):
                with open(self.path, "rb") as f:
                    atomic_write(self.path + ".bak", f.read(), mode=0o600)
            atomic_write(self.path, text.encode("utf-8"), mode=0o600)
            self._stamp = self._file_stamp()
            config.path = self.path
            config.log_warnings()
            return config

    def update(self, change):
        """Apply ``change(data)`` to the file's data as written and save it; the new Config.

        ``change`` may raise to abort; nothing is written then.  Comments in the
        file do not survive (the .bak keeps them).
        """
        with self.lock:
            try:
                text = self.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError([("", None, f"cannot read: {exc}")], self.path) from None
            data, _ = parse_config_text(text, self.path)   # an emptied file is not a blank page to write on
            data = data if isinstance(data, dict) else {}
            change(data)
            return self.write(dump_yaml(data, header=self.HEADER))


class ConfigWatcher:
    """Reloads the config when its file changes or on demand (SIGHUP).

    An invalid new file leaves the running config in place; the reason is
    logged.  The thread outlives any failure of one reload, whatever it
    raises: a watcher that died would never apply a later good file.
    """

    def __init__(self, app, config_file):
        self.app, self.config_file = app, config_file
        self._wake = threading.Event()
        self._stop = threading.Event()

    def check(self, force=False):
        """Reload if the file changed (or ``force``); returns True when a new config is active."""
        if not self.config_file.changed() and not force:
            return False
        try:
            config = self.config_file.load()
        except ConfigError as exc:
            log.error("config reload failed; still running the previous config:\n%s", exc)
            return False
        old = self.app.config
        if (config.server["host"], config.server["port"]) != (old.server["host"], old.server["port"]):
            log.warning("server.host/port changed in the config; restart ragproxy to listen there")
        if config.server["cpu_pinning"] != old.server["cpu_pinning"]:
            log.warning("server.cpu_pinning changed in the config; it takes effect when ragproxy restarts")
        if config.server["workers"] != old.server["workers"]:
            log.warning("server.workers changed in the config; restart ragproxy to run %d serving process(es)",
                        config.server["workers"])
        try:
            self.app.reload(config)
        except Exception:
            self.app.reload(old)   # not half of the new config
            raise
        log.info("config reloaded from %s (%s)", self.config_file.path, describe_models(config))
        return True

    def request_reload(self, *_signal_args):
        self._wake.set()

    def run(self):
        while not self._stop.is_set():
            interval = self.app.config.server["reload_interval"] or 3600
            forced = self._wake.wait(interval)
            self._wake.clear()
            if not self._stop.is_set():
                try:
                    self.check(force=forced)
                except Exception:
                    log.exception("config reload failed; still running the previous config")

    def stop(self):
        self._stop.set()
        self._wake.set()
