"""examples/quickstart works as its README says: echo upstream, proxy, one question."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request

from test_cli import Proc, _env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_quickstart_injects_the_right_passage(tmp_path):
    work = tmp_path / "quickstart"
    shutil.copytree(QUICKSTART, str(work), ignore=shutil.ignore_patterns("data"))
    port = _free_port()
    config = work / "config.yaml"
    config.write_text(config.read_text().replace("11500", str(port)))
    echo = subprocess.Popen([sys.executable, str(work / "echo_upstream.py"), "--port", str(port)],
                            stdout=subprocess.PIPE, universal_newlines=True)
    try:
        assert "echo upstream" in echo.stdout.readline()
        proxy = Proc([sys.executable, os.path.join(ROOT, "ragproxy.py"), "--data-dir", str(work / "data"),
                      "--config", str(config), "--port", "0"], _env(False))
        try:
            proxy.read_log_until("indexed handbook")
            req = urllib.request.Request(proxy.url + "/v1/chat/completions", method="POST", data=json.dumps({
                "model": "demo", "messages": [{"role": "user", "content": "How do I rotate the signing key?"}]
            }).encode(), headers={"Authorization": "Bearer quickstart-key", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                answer = json.loads(resp.read())["choices"][0]["message"]["content"]
                sources = resp.headers["X-Ragproxy-Sources"]
            assert "ragctl keys rotate --grace 7d" in answer
            assert answer.rstrip().endswith("How do I rotate the signing key?")
            assert sources
        finally:
            assert proxy.stop() == 0
        out = subprocess.run([sys.executable, os.path.join(ROOT, "ragproxy.py"), "search", "handbook",
                              "retry upload backoff", "--data-dir", str(work / "data"), "--config", str(config)],
                             stdout=subprocess.PIPE, universal_newlines=True, env=_env(False), timeout=30).stdout
        assert re.search(r"1\. \S+\s+handbook/retry\.py:4-\d+", out.replace("docs/", "handbook/")) or \
            "retry.py" in out.splitlines()[0]
    finally:
        echo.kill()
