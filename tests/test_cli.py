"""The command line, run as users run it: a subprocess of ragproxy.py or the .pyz.

Smoke checks run for the plain file and the built zipapp, in accelerated and
pure mode: first start creates the data directory, a chat completion goes
through, SIGHUP reloads, SIGTERM stops cleanly.
"""
import json
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
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=10)
        finally:
            if self.p.poll() is None:
                self.p.kill()


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
