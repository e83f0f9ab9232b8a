"""The command line, run as users run it: a subprocess of ragproxy.py or the .pyz, or main([...]) in-process.

Smoke checks run for the plain file and the built zipapp, in accelerated and
pure mode: first start creates the data directory, a chat completion goes
through, SIGHUP reloads, SIGTERM stops cleanly.  The one-shot commands
(index, search, kb list) are driven in-process through ragproxy.main with
captured output, and as subprocesses where the exit status or the terminal
matters.
"""
import io
import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import ragproxy
from _ragproxy.cli import SERVE_GC_THRESHOLD, SERVE_SWITCH_INTERVAL, IndexProgress, build_parser
from conftest import API_KEY, proxy_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "ragproxy.py")


def _env(pure):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPROXY_")}
    if pure:
        env["RAGPROXY_PURE"] = "1"
    return env


class Proc:
    """A running ragproxy; ``url`` is parsed from its startup log line."""

    def __init__(self, argv, env):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                  universal_newlines=True)
        self.log = []
        deadline = time.time() + 20
        while time.time() < deadline:
            line = self.p.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                return
        self.p.kill()
        raise AssertionError("ragproxy did not start:\n" + "".join(self.log) + self.p.stderr.read())

    def read_log_until(self, pattern, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.p.stderr.readline()
            self.log.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no log line matching {pattern!r}:\n" + "".join(self.log))

    def stop(self):
        """SIGTERM, then the exit status; a failed exit raises with what the process printed last."""
        self.p.send_signal(signal.SIGTERM)
        try:
            status = self.p.wait(timeout=10)
        finally:
            if self.p.poll() is None:
                self.p.kill()
        if status != 0:
            raise AssertionError(f"ragproxy exited {status} on SIGTERM; its last log lines:\n"
                                 + "".join(self.log[-20:]) + self.p.stderr.read()[-4000:])
        return status


def _get(url, key=API_KEY):
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("pure", [False, True], ids=["accelerated", "pure"])
@pytest.mark.parametrize("form", ["script", "pyz"])
def test_smoke_first_start_proxy_reload_stop(tmp_path, fake, pyz, form, pure):
    data = tmp_path / "data"
    argv = [sys.executable, SCRIPT if form == "script" else pyz, "--data-dir", str(data), "--port", "0"]
    proc = Proc(argv, _env(pure))
    try:
        key = re.search(r"API key (\S+)", "".join(proc.log)).group(1)
        assert (data / "config" / "config.yaml").exists()
        secret = data / "config" / "secret_key.yaml"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        for sub in ("vectordb", "documents", "cache/embedding", "cache/rerank", "logs"):
            assert (data / sub).is_dir()
        health = _get(proc.url + "/health")
        assert health["features"]["pure"] is pure
        # The serving process runs the cyclic collector less often and switches threads sooner, as its /metrics say.
        metrics = urllib.request.Request(proc.url + "/metrics", headers={"Authorization": "Bearer " + key})
        with urllib.request.urlopen(metrics, timeout=5) as resp:
            text = resp.read().decode()
        assert 'ragproxy_python_gc_threshold{generation="0"} %d\n' % SERVE_GC_THRESHOLD in text
        assert "ragproxy_python_switch_interval_seconds %r\n" % SERVE_SWITCH_INTERVAL in text
        assert 'ragproxy_python_gc_collections_total{generation="2"} ' in text
        # The panel is served from beside the script or from inside the .pyz,
        # and the key printed once in the log logs in to the admin API.
        with urllib.request.urlopen(proc.url + "/", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/html") and b"/admin/api" in resp.read()
        panel_key = re.search(r"admin panel key \(shown once; also in \S+\): (\S+)", "".join(proc.log)).group(1)
        assert panel_key in secret.read_text()
        login = urllib.request.Request(proc.url + "/admin/api/login", method="POST",
                                       data=json.dumps({"key": panel_key}).encode(),
                                       headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(login, timeout=5) as resp:
            token = json.loads(resp.read())["token"]
        assert _get(proc.url + "/admin/api/overview", token)["kbs"] == ["docs"]
        # Point the catch-all at the fake upstream and reload with SIGHUP.
        config = data / "config" / "config.yaml"
        config.write_text(config.read_text().replace("http://127.0.0.1:11434", fake.url)
                          .replace("reload_interval: 2", "reload_interval: 0"))
        proc.p.send_signal(signal.SIGHUP)
        proc.read_log_until("config reloaded")
        req = urllib.request.Request(proc.url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": "llama3", "messages": [
                                         {"role": "user", "content": "through the binary"}]}).encode(),
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.loads(resp.read())["choices"][0]["message"]["content"] == "ECHO: through the binary"
        # A broken edit is logged and the old config keeps serving.
        config.write_text(config.read_text() + "\nbogus_key: 1\n")
        proc.p.send_signal(signal.SIGHUP)
        proc.read_log_until("config reload failed")
        assert _get(proc.url + "/health", key)["status"] == "ok"
    finally:
        assert proc.stop() == 0
    assert (data / "logs" / "rag-proxy.log").stat().st_size > 0


def _chat(url, key, text="polled", model="llama3"):
    """Status and body of one chat completion through the proxy."""
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": model, "messages": [
                                     {"role": "user", "content": text}]}).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_config_file_change_is_picked_up_by_polling(tmp_path, fake):
    data = tmp_path / "d"
    proc = Proc([sys.executable, SCRIPT, "--data-dir", str(data), "--port", "0"], _env(False))
    try:
        key = re.search(r"API key (\S+)", "".join(proc.log)).group(1)
        # The default catch-all is a local Ollama, which does not run here.
        assert _chat(proc.url, key)[0] == 502
        config = data / "config" / "config.yaml"
        config.write_text(config.read_text().replace("reload_interval: 2", "reload_interval: 0.2")
                          .replace("http://127.0.0.1:11434", fake.url))
        proc.read_log_until("config reloaded", timeout=10)
        status, body = _chat(proc.url, key)
        assert status == 200 and body["choices"][0]["message"]["content"] == "ECHO: polled"
    finally:
        proc.stop()


def test_a_python_without_sqlite3_still_serves_with_the_request_log_off(tmp_path, fake):
    data = tmp_path / "d"
    (data / "config").mkdir(parents=True)
    (data / "config" / "config.yaml").write_text(proxy_config(fake.url))
    # As a Python built without sqlite3: importing it fails.
    run_blocked = ("import runpy, sys; sys.modules['sqlite3'] = None; sys.argv = sys.argv[1:]; "
                   "sys.path.insert(0, %r); runpy.run_path(sys.argv[0], run_name='__main__')" % ROOT)
    proc = Proc([sys.executable, "-c", run_blocked, SCRIPT, "--data-dir", str(data), "--port", "0"], _env(False))
    try:
        assert "request log off: this Python cannot import sqlite3" in "".join(proc.log)
        status, body = _chat(proc.url, API_KEY, "no sqlite")
        assert status == 200 and body["choices"][0]["message"]["content"] == "ECHO: no sqlite"
        assert _get(proc.url + "/health", API_KEY)["status"] == "ok"
    finally:
        assert proc.stop() == 0


def test_version_names_accelerators(pyz):
    out = subprocess.run([sys.executable, SCRIPT, "--version"], stdout=subprocess.PIPE, env=_env(False),
                         universal_newlines=True).stdout
    assert out.startswith("ragproxy ") and "Python" in out
    pure = subprocess.run([sys.executable, pyz, "--version"], stdout=subprocess.PIPE, env=_env(True),
                          universal_newlines=True).stdout
    assert "pure mode" in pure


def test_python_dash_m_ragproxy_runs_the_same_command_line(tmp_path):
    # As the project we model documents it: python -m ragproxy, from beside ragproxy.py.
    script = subprocess.run([sys.executable, SCRIPT, "--version"], stdout=subprocess.PIPE, env=_env(False),
                            universal_newlines=True, check=True).stdout
    module = subprocess.run([sys.executable, "-m", "ragproxy", "--version"], stdout=subprocess.PIPE, cwd=ROOT,
                            env=_env(False), universal_newlines=True, check=True).stdout
    assert module == script and module.startswith("ragproxy ")
    (tmp_path / "d" / "config").mkdir(parents=True)   # search needs a data directory: it creates none
    ragproxy.write_default_config(str(tmp_path / "d" / "config" / "config.yaml"))
    search = subprocess.run([sys.executable, "-m", "ragproxy", "search", "docs", "anything", "--data-dir",
                             str(tmp_path / "d")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=_env(False), universal_newlines=True, timeout=60)
    assert (search.returncode, search.stdout) == (0, "no match\n"), search.stderr


def test_invalid_config_refuses_to_start_and_says_where(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("server:\n  prot: 1\n")
    p = subprocess.run([sys.executable, SCRIPT, "--data-dir", str(tmp_path / "d"), "--config", str(bad)],
                       stderr=subprocess.PIPE, universal_newlines=True, env=_env(False), timeout=20)
    assert p.returncode == 2
    assert "c.yaml:2: server.prot: unknown key (did you mean 'port'?)" in p.stderr
    assert "Traceback" not in p.stderr


def test_public_host_without_auth_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api_key_auth: false\nproviders:\n  llm:\n    o: {type: ollama, base_url: 'http://h:1'}\n"
                   "models:\n  - {name: '*', upstream: o}\n")
    p = subprocess.run([sys.executable, SCRIPT, "--data-dir", str(tmp_path / "d"), "--config", str(cfg),
                        "--host", "0.0.0.0", "--port", "0"],
                       stderr=subprocess.PIPE, universal_newlines=True, env=_env(False), timeout=20)
    assert p.returncode == 2 and "api_key_auth" in p.stderr and "api_keys" in p.stderr


def test_env_port_and_cli_precedence(tmp_path):
    env = _env(False)
    env.update(RAGPROXY_PORT="0", RAGPROXY_DATA_DIR=str(tmp_path / "envdata"), RAGPROXY_LOG_LEVEL="debug")
    proc = Proc([sys.executable, SCRIPT], env)
    try:
        assert (tmp_path / "envdata" / "config" / "config.yaml").exists()
    finally:
        proc.stop()
    bad = dict(env, RAGPROXY_PORT="not-a-port")
    p = subprocess.run([sys.executable, SCRIPT], stderr=subprocess.PIPE, universal_newlines=True, env=bad,
                       timeout=20)
    assert p.returncode == 2 and "RAGPROXY_PORT" in p.stderr


def test_workers_below_one_are_refused_from_the_flag_the_environment_and_the_config(tmp_path):
    env = dict(_env(False), RAGPROXY_DATA_DIR=str(tmp_path / "d"))
    p = subprocess.run([sys.executable, SCRIPT, "--port", "0", "--workers", "0"], stderr=subprocess.PIPE,
                       universal_newlines=True, env=env, timeout=20)
    assert p.returncode == 2 and "--workers" in p.stderr and "at least 1" in p.stderr
    p = subprocess.run([sys.executable, SCRIPT, "--port", "0"], stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(env, RAGPROXY_WORKERS="two"), timeout=20)
    assert p.returncode == 2 and "RAGPROXY_WORKERS" in p.stderr and "'two'" in p.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server: {{workers: 0}}\napi_keys: [{API_KEY}]\n")
    p = subprocess.run([sys.executable, SCRIPT, "--config", str(cfg), "--port", "0"], stderr=subprocess.PIPE,
                       universal_newlines=True, env=env, timeout=20)
    assert p.returncode == 2 and "server.workers" in p.stderr
    assert not (tmp_path / "d" / "run").exists()   # refused before anything was started


def test_startup_line_says_which_certificates_go_unchecked(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"api_keys: [{API_KEY}]\nproviders:\n  llm:\n"
                   "    lab: {type: openai, base_url: 'https://gw.lab:8443/v1', tls_verify: false}\n"
                   "    corp: {type: openai, base_url: 'https://gw.corp/v1'}\n"
                   "models:\n  - {name: 'lab-*', upstream: lab}\n  - {name: '*', upstream: corp}\n")
    proc = Proc([sys.executable, SCRIPT, "--data-dir", str(tmp_path / "d"), "--config", str(cfg), "--port", "0"],
                _env(False))
    try:
        line = proc.log[-1]
        assert "lab https://gw.lab:8443/v1 (certificate not checked)" in line
        assert "* -> corp https://gw.corp/v1);" in line  # checked, as by default
    finally:
        proc.stop()


def test_missing_explicit_config_is_an_error(tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, "--data-dir", str(tmp_path), "--config", str(tmp_path / "no.yaml")],
                       stderr=subprocess.PIPE, universal_newlines=True, env=_env(False), timeout=20)
    assert p.returncode == 2 and "does not exist" in p.stderr


def _config_with_a_dense_kb(fake_url):
    """One Ollama upstream and a dense KB whose embeddings come from the fake upstream too."""
    return (f"api_keys: [{API_KEY}]\nproviders:\n  llm:\n    ol: {{type: ollama, base_url: '{fake_url}', "
            f"read_timeout: 5}}\n  embedding:\n    em: {{type: openai, base_url: '{fake_url}/v1', model: emb}}\n"
            "models:\n  - {name: '*', upstream: ol, kb: [docs]}\n"
            "knowledge_bases:\n  docs: {retrieval: dense, embedding: em}\n")


def test_a_model_name_cannot_forge_a_log_line(tmp_path, fake):
    data = tmp_path / "d"
    (data / "config").mkdir(parents=True)
    (data / "documents" / "docs").mkdir(parents=True)
    (data / "documents" / "docs" / "retry.md").write_text("# Retries\n\nRetry uploads with a backoff.\n")
    (data / "config" / "config.yaml").write_text(_config_with_a_dense_kb(fake.url))
    proc = Proc([sys.executable, SCRIPT, "--data-dir", str(data), "--port", "0"], _env(False))
    try:
        proc.read_log_until("indexed docs")
        # The query's embedding fails, so retrieval logs a warning naming the model.
        fake.fail_next(400, path="/v1/embeddings", count=10)
        status, _ = _chat(proc.url, API_KEY, "how do retries work?", model="llama3\nERROR forged\x1b[2J\u2028x")
        assert status == 200   # on_failure: degrade
        line = proc.read_log_until("retrieval failed")
    finally:
        assert proc.stop() == 0
    assert "retrieval failed for llama3\\nERROR forged\\x1b[2J\\u2028x (docs)" in line
    log_file = data / "logs" / "rag-proxy.log"
    logged = log_file.read_text(encoding="utf-8")
    assert "retrieval failed for llama3\\nERROR forged\\x1b[2J\\u2028x (docs)" in logged
    assert not [ln for ln in logged.splitlines() if "forged" in ln and "retrieval failed" not in ln]
    assert "\x1b" not in logged and "\u2028" not in logged
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600


def test_first_start_shows_the_keys_on_the_terminal_only_and_keeps_the_files_private(tmp_path):
    data = tmp_path / "data"
    proc = Proc([sys.executable, SCRIPT, "--data-dir", str(data), "--port", "0"], _env(False))
    try:
        terminal = "".join(proc.log)
        _get(proc.url + "/health")   # serving, its signal handlers in place
    finally:
        assert proc.stop() == 0
    # Shown once on stderr, and kept in the files they live in.
    api_key = re.search(r"clients authenticate with the API key (\S+)", terminal).group(1)
    panel_key = re.search(r"admin panel key \(shown once; also in \S+\): (\S+)", terminal).group(1)
    config, secret = data / "config" / "config.yaml", data / "config" / "secret_key.yaml"
    assert api_key in config.read_text() and panel_key in secret.read_text()
    log_file = data / "logs" / "rag-proxy.log"
    proc = Proc([sys.executable, SCRIPT, "--data-dir", str(data), "--port", "0"], _env(False))
    try:
        again = "".join(proc.log)
        _get(proc.url + "/health")
    finally:
        assert proc.stop() == 0
    assert api_key not in again and panel_key not in again   # once: not at the next start
    logged = log_file.read_text()
    assert "listening on" in logged and api_key not in logged and panel_key not in logged
    for path in (config, secret, log_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


# -- the one-shot commands, in-process ------------------------------------------

@pytest.fixture
def cli(capsys):
    """``run(*argv, env={})``: ``(exit status, stdout, stderr)`` of ragproxy.main, as ``sys.exit(main())`` sees it.

    main() points the ragproxy logger at this test's stderr (and a log file);
    the logger is put back afterwards so later tests' caplog still sees records.
    """
    logger = logging.getLogger("ragproxy")
    saved = list(logger.handlers), logger.level, logger.propagate

    def run(*argv, env=None):
        try:
            status = ragproxy.main([str(a) for a in argv], environ=dict(env or {}))
        except SystemExit as exc:   # argparse: --help and usage errors
            status = exc.code
        out, err = capsys.readouterr()
        return status, out, err

    yield run
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    for handler in saved[0]:
        logger.addHandler(handler)
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def _data_dir(tmp_path, kb="{retrieval: lexical}", extra=""):
    """A data directory with a config (one lexical KB ``docs``) and its documents folder; its path."""
    data = tmp_path / "data"
    (data / "config").mkdir(parents=True)
    (data / "documents" / "docs").mkdir(parents=True)
    (data / "config" / "config.yaml").write_text(
        f"api_keys: [{API_KEY}]\nproviders:\n  llm:\n    o: {{type: ollama, base_url: 'http://127.0.0.1:9'}}\n"
        f"{extra}models:\n  - {{name: '*', upstream: o, kb: [docs]}}\nknowledge_bases:\n  docs: {kb}\n")
    return data


def _docs(data, count=3):
    for i in range(count):
        (data / "documents" / "docs" / f"note{i}.md").write_text(f"# Note {i}\n\nRetry uploads {i} times.\n")


def test_top_k_must_be_a_positive_number(cli, tmp_path):
    data = _data_dir(tmp_path)
    _docs(data)
    assert cli("index", "--data-dir", data)[0] == 0
    for bad, says in (("0", "must be at least 1, got 0"), ("-3", "must be at least 1, got -3"),
                      ("two", "expected a whole number of at least 1, got 'two'")):
        status, out, err = cli("search", "docs", "retry", "--top-k", bad, "--data-dir", data)
        assert (status, out) == (2, ""), (bad, err)
        assert "argument --top-k: " + says in err
    status, out, _ = cli("search", "docs", "retry", "--top-k", "2", "--data-dir", data)
    assert status == 0 and [line[:3] for line in out.splitlines() if line[:3].strip().endswith(".")] == \
        [" 1.", " 2."]


def test_search_cites_lines_as_injected_chunks_are_labelled(cli, tmp_path):
    data = _data_dir(tmp_path)
    (data / "documents" / "docs" / "one.md").write_text("Retry uploads five times.\n")
    (data / "documents" / "docs" / "two.md").write_text("# Retry\n\nRetry uploads twice.\n")
    assert cli("index", "--data-dir", data)[0] == 0
    status, out, _ = cli("search", "docs", "retry uploads", "--data-dir", data)
    cited = sorted(line.split()[2] for line in out.splitlines() if line[:3].strip().endswith("."))
    assert status == 0 and cited == ["docs/one.md:1", "docs/two.md:1-3"]


@pytest.mark.parametrize("query", ["", "   ", "\t\n"])
def test_an_empty_query_is_an_error(cli, tmp_path, query):
    data = _data_dir(tmp_path)
    _docs(data)
    assert cli("index", "--data-dir", data)[0] == 0
    status, out, err = cli("search", "docs", query, "--data-dir", data)
    assert (status, out) == (2, "")
    assert "the query is empty" in err and "Traceback" not in err


def test_index_exits_3_when_files_were_deferred(cli, tmp_path, fake):
    data = _data_dir(tmp_path, kb="{retrieval: dense, embedding: em}",
                     extra=f"  embedding:\n    em: {{type: openai, base_url: '{fake.url}/v1', model: emb}}\n")
    _docs(data, 2)
    fake.fail_next(503, path="/v1/embeddings", count=50)
    status, out, err = cli("index", "--data-dir", data)
    assert status == 3, err
    assert "2 deferred" in out and "deferred docs/note0.md" in out
    assert "docs: 2 files deferred; the next index run retries them" in err
    assert "docs: 2 files deferred by the last index run, to be retried next run (kb list --json names them " \
        "and why)" in cli("kb", "list", "--data-dir", data)[1]
    (entry,) = json.loads(cli("kb", "list", "--json", "--data-dir", data)[1])
    assert [d["file"] for d in entry["deferred"]] == ["docs/note0.md", "docs/note1.md"]
    assert all("503" in d["reason"] for d in entry["deferred"])
    fake.reset_faults()
    status, out, _ = cli("index", "--data-dir", data)
    assert status == 0 and "2 added" in out and "0 deferred" in out


def test_index_exits_4_when_a_knowledge_base_has_no_readable_source(cli, tmp_path):
    missing = tmp_path / "does-not-exist"
    data = _data_dir(tmp_path, kb=f"{{retrieval: lexical, sources: ['{missing}']}}")
    status, out, err = cli("index", "--data-dir", data)
    assert status == 4, err
    assert "0 added" in out and f"WARNING kb docs: source '{missing}' does not exist" in err
    assert "ERROR docs: no readable source, nothing was indexed" in err
    # One readable source is enough: the missing one is still a warning, but the run did its job.
    _docs(data, 1)
    status, out, err = cli("index", "--data-dir", data)
    assert status == 0 and "1 added" in out and str(missing) in err and "ERROR" not in err


def test_exit_statuses_of_a_real_process(tmp_path):
    """As a script sees them: 0, 2 (usage), 4 (no readable source), from ``python ragproxy.py``."""
    data = _data_dir(tmp_path)

    def run(*argv):
        return subprocess.run([sys.executable, SCRIPT, *argv, "--data-dir", str(data)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, env=_env(False), timeout=60)

    assert run("index").returncode == 4          # the documents folder is empty
    _docs(data, 1)
    assert run("index").returncode == 0
    assert run("search", "docs", "").returncode == 2
    assert run("search", "docs", "retry", "--top-k", "0").returncode == 2
    assert run("search", "docs", "retry").returncode == 0


def _actions(parser, where=("ragproxy",)):
    """``(command path, action)`` for every argument of ``parser`` and its subcommands."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            choices = {a.dest: a for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield where + (name,), choices.get(name)   # the subcommand itself, as listed in its parent
                yield from _actions(sub, where + (name,))
        yield where, action


def test_every_argument_and_subcommand_has_help(cli):
    parser = build_parser()
    missing = [(" ".join(where), getattr(a, "option_strings", None) or getattr(a, "dest", None))
               for where, a in _actions(parser) if a is None or not (a.help or "").strip()]
    assert missing == []
    # And --help shows each one with that text.
    subcommands = [name for name in parser._subparsers._group_actions[0].choices]
    assert subcommands == ["serve", "index", "search", "kb", "import", "mcp"]
    status, out, _ = cli("--help")
    assert status == 0 and all(name in out for name in subcommands) and "exit status" in out
    for name in subcommands:
        status, out, _ = cli(name, "--help")
        assert status == 0, name
        text = " ".join(out.split())
        sub = parser._subparsers._group_actions[0].choices[name]
        for action in sub._actions:
            words = " ".join(action.help.split())
            assert words.split("(")[0].strip() in text, (name, action.dest)
    assert "--top-k N" in cli("search", "--help")[1]


def test_unknown_log_levels_list_the_valid_ones(cli, tmp_path):
    data = _data_dir(tmp_path)
    status, _, err = cli("kb", "list", "--log-level", "verbose", "--data-dir", data)
    assert status == 2 and "invalid choice: 'VERBOSE' (choose from 'DEBUG', 'INFO', 'WARNING', 'ERROR')" in err
    status, out, err = cli("kb", "list", "--data-dir", data, env={"RAGPROXY_LOG_LEVEL": "verbose"})
    assert (status, out) == (2, "")
    assert "RAGPROXY_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, got 'verbose'" in err
    assert "Traceback" not in err
    assert cli("kb", "list", "--data-dir", data, env={"RAGPROXY_LOG_LEVEL": "warning"})[0] == 0


def test_config_errors_are_reported_in_file_order(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  port: x\n  prot: 1\nrag:\n  top_k: 0\n"
                      "providers:\n  llm:\n    o: {type: ollama, base_url: 'http://127.0.0.1:9'}\n"
                      "models:\n  - {name: '*', upstream: nowhere}\nbogus: 1\n")
    p = subprocess.run([sys.executable, SCRIPT, "kb", "list", "--data-dir", str(tmp_path), "--config", str(config)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=_env(False),
                       timeout=30)
    assert p.returncode == 2
    lines = [line.split("c.yaml:", 1)[1].split(":", 1)[0] for line in p.stderr.splitlines() if "c.yaml:" in line]
    assert lines == ["2", "3", "5", "10", "11"], p.stderr


@pytest.mark.parametrize("argv", [["search", "docs", "retry"], ["kb", "list"], ["kb", "list", "--json"],
                                  ["index"], ["import", "docs", "corpus.jsonl"]])
def test_a_data_directory_that_does_not_exist_is_an_error_and_nothing_is_created(cli, tmp_path, argv):
    typo = tmp_path / "dta"
    status, out, err = cli(*argv, "--data-dir", typo)
    assert (status, out) == (2, ""), err
    assert f"data directory {typo} does not exist" in err and "nothing was created" in err
    assert not typo.exists() and os.listdir(str(tmp_path)) == []


def test_read_only_commands_write_no_config_into_a_data_directory_without_one(cli, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for argv in (["search", "docs", "retry"], ["kb", "list"]):
        status, out, err = cli(*argv, "--data-dir", bare)
        assert (status, out) == (2, "") and "no config file" in err and "API key" not in err
    assert os.listdir(str(bare)) == []


def test_index_with_a_config_may_start_a_new_data_directory(cli, tmp_path):
    docs = tmp_path / "handbook"
    docs.mkdir()
    (docs / "retry.md").write_text("# Retries\n\nRetry uploads with a backoff.\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"api_keys: [{API_KEY}]\nproviders:\n  llm:\n    o: {{type: ollama, base_url: 'http://h:1'}}\n"
                      f"models:\n  - {{name: '*', upstream: o, kb: [hb]}}\nknowledge_bases:\n"
                      f"  hb: {{retrieval: lexical, sources: ['{docs}']}}\n")
    status, out, err = cli("index", "--data-dir", tmp_path / "new", "--config", config)
    assert status == 0 and "1 added" in out, err
    assert "API key" not in err and not (tmp_path / "new" / "config" / "config.yaml").exists()
    status, out, _ = cli("search", "hb", "backoff", "--data-dir", tmp_path / "new", "--config", config)
    assert status == 0 and "handbook/retry.md" in out


def test_kb_list_json_lists_sources_warnings_and_skipped_files(cli, tmp_path):
    missing = tmp_path / "srv" / "does-not-exist"
    data = _data_dir(tmp_path, kb=f"{{retrieval: lexical, max_file_bytes: 200, sources: ['{missing}']}}")
    _docs(data, 2)
    (data / "documents" / "docs" / "big.md").write_text("# Big\n\n" + "words " * 100)
    assert cli("index", "--data-dir", data)[0] == 0
    status, out, _ = cli("kb", "list", "--json", "--data-dir", data)
    assert status == 0
    (entry,) = json.loads(out)   # a list: one object per knowledge base
    assert {k: entry[k] for k in ("name", "retrieval", "files", "chunks")} == \
        {"name": "docs", "retrieval": "lexical", "files": 2, "chunks": 2}
    assert entry["generation"] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["last_indexed"])
    assert abs(time.mktime(time.strptime(entry["last_indexed"], "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
        time.gmtime())) < 600
    states = {s["kind"]: (s["state"], s["path"]) for s in entry["sources"]}
    assert states == {"documents": ("ok", str(data / "documents" / "docs")), "source": ("missing", str(missing))}
    assert [w for w in entry["warnings"] if str(missing) in w]
    assert [(s["file"], bool(s["reason"])) for s in entry["skipped"]] == [("docs/big.md", True)]
    assert entry["deferred"] == []
    # The table says the same in one line each.
    status, out, _ = cli("kb", "list", "--data-dir", data)
    lines = out.splitlines()
    assert status == 0 and lines[0].split()[:5] == ["name", "retrieval", "chunks", "files", "size"]
    assert lines[1].split()[:4] == ["docs", "lexical", "2", "2"]
    assert [line for line in lines if line.startswith("docs: warning: ") and str(missing) in line]
    assert "docs: 1 file skipped by the last index run (kb list --json names them and why)" in lines


def test_kb_list_json_of_a_knowledge_base_never_indexed(cli, tmp_path):
    data = _data_dir(tmp_path)
    status, out, _ = cli("kb", "list", "--json", "--data-dir", data)
    (entry,) = json.loads(out)
    assert status == 0 and (entry["last_indexed"], entry["generation"], entry["chunks"]) == (None, None, 0)
    assert cli("kb", "list", "--data-dir", data)[1].splitlines()[1].split()[-1] == "never"


# -- progress ------------------------------------------------------------------

class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_progress_off_a_terminal_is_a_line_every_few_seconds_with_rate_and_eta():
    clock, out, status = _Clock(), io.StringIO(), {"chunks": 0}
    progress = IndexProgress("docs", out, False, status, clock=clock, every=10.0)
    for n in range(1, 1001):   # 16 files a second (a step binary fractions hold exactly) for 62.5 s
        status["chunks"] = 3 * n
        progress(n, 1000, f"docs/f{n}.md")
        clock.now += 0.0625
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "[docs] 1/1000 files (0%), 3 chunks"   # at once, but no rate from one file
    assert lines[1] == "[docs] 161/1000 files (16%), 483 chunks, 16.1 files/s, ETA 52s"
    assert lines[-1] == "[docs] 1000/1000 files (100%), 3000 chunks, 16.0 files/s, 1m02s so far"
    assert [line.split("/")[0] for line in lines] == ["[docs] " + str(n) for n in (1, 161, 321, 481, 641, 801, 961,
                                                                                 1000)]  # every 10 s, and the last


def test_progress_on_a_terminal_redraws_one_line():
    clock, out = _Clock(), io.StringIO()
    progress = IndexProgress("docs", out, True, {"chunks": 12}, clock=clock, redraw=0.2)
    progress(1, 7200, "a")
    clock.now += 3600
    progress(3600, 7200, "b")     # one file a second: an hour to go
    clock.now += 0.1
    progress(3601, 7200, "c")     # too soon to redraw
    clock.now += 3599
    progress(7200, 7200, "d")
    shown = out.getvalue()
    assert shown.count("\n") == 1 and shown.endswith("\n")
    frames = shown.rstrip("\n").split("\r")[1:]
    assert [f.rstrip() for f in frames] == [
        "[docs] 1/7200 files (0%), 12 chunks",
        "[docs] 3600/7200 files (50%), 12 chunks, 1.0 files/s, ETA 1h00m",
        "[docs] 7200/7200 files (100%), 12 chunks, 1.0 files/s, 2h00m so far"]
    assert len(set(len(f) for f in frames[1:])) == 1 or len(frames[2]) >= len(frames[1].rstrip())
    progress.close()   # the last line already ended
    assert out.getvalue() == shown


def test_index_progress_on_a_terminal_and_off_one(tmp_path):
    import pty

    data = _data_dir(tmp_path)
    _docs(data, 40)
    argv = [sys.executable, SCRIPT, "index", "--data-dir", str(data), "--full"]
    piped = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                           env=_env(False), timeout=60)
    progress = [line for line in piped.stderr.splitlines() if line.startswith("[docs] ")]
    assert piped.returncode == 0 and "\r" not in piped.stderr
    assert progress[0].startswith("[docs] 1/40 files (2%)") and progress[-1].startswith("[docs] 40/40 files (100%)")
    assert "chunks" in progress[-1] and len(progress) < 10
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=_env(False))
        os.close(slave)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:   # the other end closed: the process is gone
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()
    finally:
        os.close(master)
    shown = shown.decode()
    assert "\r[docs] 1/40 files" in shown and "\r[docs] 40/40 files (100%)" in shown
    assert len([line for line in shown.replace("\r\n", "\n").split("\n") if "[docs]" in line]) == 1
