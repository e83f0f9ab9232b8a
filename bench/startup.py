#!/usr/bin/env python3
"""How long ragproxy takes to start, as a script and as the .pyz, cold and warm, next to a bare Python.

    python bench/startup.py                          # 100,000-chunk KB, 7 rounds (~3 min, most of it the KB)
    python bench/startup.py --chunks 2000 --rounds 3 # a quick run
    python bench/startup.py --kb-dir /tmp/kb100k     # keep the built KB there and reuse it next time
    python bench/startup.py --compare /tmp/old/ragproxy.py   # another ragproxy.py beside (e.g. the
                                                     # single file from before the package split)
    python bench/startup.py --compare /tmp/old.pyz   # or another .pyz
    python bench/startup.py --json                   # the table, then one JSON line
    python bench/startup.py --ragproxy /tmp/try/ragproxy.py  # measure another checkout

Every side runs in fresh processes of the interpreter running this script, in
rounds: each round runs every case once, in the same order, so a burst of
outside load hits them all alike; the figures are medians over the rounds.

Cases, each from process start to exit (or, for ``serve``, to the first
answered request):

- ``python -c pass``: what any Python program pays; the yardstick of the targets.
- ``--version``.
- ``search``: the first query of a lexical knowledge base of ``--chunks``
  chunks (stdlib source, chunked as ragproxy chunks code, imported once with
  ``ragproxy.py import``), ``--json`` output.
- ``serve``: from process start until GET /health has been answered on a
  port the server chose (the background indexer starts on the same KB).

Each for ``python ragproxy.py`` (a copy of the checkout) and for
``python dist/ragproxy.pyz`` (built here with tools/build_pyz.py), and each
cold and warm.  Cold is the first run after a build: a checkout copy with no
``__pycache__`` (a fresh clone), an archive with an empty cache directory
(RAGPROXY_CACHE_DIR), made anew for every cold run.  Warm is every later
run.  PYTHONDONTWRITEBYTECODE is unset for all of them, as on a user's
machine.  The page cache is warm (the KB was just written).

Targets (issue 13): ``--version`` at most 1.5x a bare start; the first
search of the 100,000-chunk KB at most 3x.  The verdict lines compare the
warm figures of both forms with them.

Standard library only; Python 3.9+.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from perf import chunk_corpus, load_ragproxy, make_queries, print_table, stdlib_files

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHECKOUT_TREES = ("ragproxy.py", "_ragproxy", "vendored", "static")
TARGETS = {"--version": 1.5, "search": 3.0}


def build_kb(work, chunks_wanted, checkout, script=None, name="data"):
    """A data directory whose one lexical KB ``kb`` holds about ``chunks_wanted`` chunks; ``(data, config, query)``.

    The KB is made by ``ragproxy.py import`` of ``script`` (default: the checkout's): another version
    may not read the store format this one writes.
    """
    rp = load_ragproxy(os.path.join(checkout, "ragproxy.py"))
    root, files = stdlib_files()
    chunks, _, _ = chunk_corpus(rp, root, files[:max(20, chunks_wanted // 20)] if chunks_wanted < 20000 else files)
    if not chunks:
        raise SystemExit("no stdlib chunks to build a KB from")
    query = make_queries(chunks, 2)[-1]
    data = os.path.join(work, name)
    config = os.path.join(data, "config", "config.yaml")
    marker = os.path.join(data, "built-for")
    if os.path.exists(marker) and open(marker).read() == str(chunks_wanted):
        return data, config, query
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(os.path.dirname(config))
    with open(config, "w", encoding="utf-8") as f:
        f.write("server: {host: 127.0.0.1, port: 0}\napi_key_auth: false\n"
                "providers:\n  llm:\n    o: {type: ollama, base_url: 'http://127.0.0.1:9'}\n"
                "models:\n  - {name: '*', upstream: o, kb: [kb]}\n"
                "knowledge_bases:\n  kb:\n    retrieval: lexical\n    max_file_bytes: 4294967296\n")
    corpus = os.path.join(work, "corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(chunks_wanted):
            c = chunks[i % len(chunks)]
            f.write(json.dumps({"_id": str(i), "title": c.symbol or c.source, "text": c.text}) + "\n")
    started = time.perf_counter()
    subprocess.run([sys.executable, script or os.path.join(checkout, "ragproxy.py"), "import", "kb", corpus,
                    "--data-dir", data, "--config", config, "--log-level", "WARNING"],
                   check=True, stdout=subprocess.DEVNULL, timeout=3600)
    print(f"built a KB of {chunks_wanted} records in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    os.unlink(corpus)
    with open(marker, "w") as f:
        f.write(str(chunks_wanted))
    return data, config, query


def copy_checkout(source, target):
    """The files a user copies (or clones): no __pycache__, so the first run compiles."""
    os.makedirs(target)
    for name in CHECKOUT_TREES:
        path = os.path.join(source, name)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(target, name), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif os.path.isfile(path):
            shutil.copy(path, os.path.join(target, name))
    return os.path.join(target, "ragproxy.py")


class Side:
    """One way of starting ragproxy: ``prepare()`` before each timed run gives the argv prefix and env;
    ``data`` is the ``(data dir, config, query)`` it searches, when not the one every other side shares."""

    def __init__(self, label, prepare, data=None):
        self.label, self.prepare, self.data = label, prepare, data


def sides(args, kb_dir, work, base_env):
    """The sides to time; ``work`` holds their copies, ``kb_dir`` the KBs that --compare sides build."""
    checkout = os.path.dirname(os.path.abspath(args.ragproxy))
    out = []
    warm_script = copy_checkout(checkout, os.path.join(work, "checkout-warm"))
    out.append(Side("python ragproxy.py, warm", lambda: ([sys.executable, warm_script], base_env)))
    counter = [0]

    def fresh(prefix):
        counter[0] += 1
        return os.path.join(work, "%s-%d" % (prefix, counter[0]))

    def cold_script():
        return [sys.executable, copy_checkout(checkout, fresh("checkout-cold"))], base_env
    out.append(Side("python ragproxy.py, cold", cold_script))
    pyz = os.path.join(work, "ragproxy.pyz")
    subprocess.run([sys.executable, os.path.join(checkout, "tools", "build_pyz.py"), "--root", checkout,
                    "--out", pyz], check=True, stdout=subprocess.DEVNULL)
    warm_cache = os.path.join(work, "pyz-cache-warm")
    out.append(Side("python ragproxy.pyz, warm",
                    lambda: ([sys.executable, pyz], dict(base_env, RAGPROXY_CACHE_DIR=warm_cache))))
    out.append(Side("python ragproxy.pyz, cold",
                    lambda: ([sys.executable, pyz], dict(base_env, RAGPROXY_CACHE_DIR=fresh("pyz-cache-cold")))))
    for n, other in enumerate(args.compare, 1):
        if other.endswith(".pyz"):   # an archive runs as it is
            script = os.path.abspath(other)
        else:                        # a checkout (or single file) runs from a copy, as the warm script side
            other_copy = os.path.join(work, "compare-%d" % n)
            shutil.copytree(os.path.dirname(os.path.abspath(other)), other_copy, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", ".git", "data", "dist", "tests", "bench"))
            script = os.path.join(other_copy, os.path.basename(other))
        data = build_kb(kb_dir, args.chunks, checkout, script, "data-compare-%d" % n)
        out.append(Side("compare-%d (%s)" % (n, other), lambda script=script: ([sys.executable, script], base_env),
                        data))
    return out


def timed(argv, env):
    started = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=600)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), proc.returncode, proc.stderr.decode()[-400:]))
    return seconds, proc.stdout.decode()


def timed_serve(argv, env):
    """Seconds from starting the server to the answer of its first request (GET /health)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            universal_newlines=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        if url is None:
            raise RuntimeError("the server did not start: " + " ".join(argv))
        with urllib.request.urlopen(url + "/health", timeout=60) as resp:
            resp.read()
        return time.perf_counter() - started, ""
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stderr.close()


def run(args):
    work = args.kb_dir or tempfile.mkdtemp(prefix="ragproxy-startup-")
    os.makedirs(work, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith("RAGPROXY_") and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    runs_dir = tempfile.mkdtemp(prefix="runs-", dir=work)
    try:
        shared = build_kb(work, args.chunks, os.path.dirname(os.path.abspath(args.ragproxy)))
        query = shared[2]

        def commands(side):
            data, config, query = side.data or shared
            common = ["--data-dir", data, "--config", config, "--log-level", "WARNING"]
            return {"--version": (["--version"], timed),
                    "search": (["search", "kb", query, "--json"] + common, timed),
                    "serve": (["serve", "--port", "0"] + ["--data-dir", data, "--config", config], timed_serve)}

        all_sides = sides(args, work, runs_dir, base_env)
        # Warm the warm sides once (their first run would be cold), untimed.
        for side in all_sides:
            if side.label.endswith("warm") or side.data is not None:
                argv, env = side.prepare()
                for flags, how in commands(side).values():
                    how(argv + flags, env)
        cases = [("python -c pass", lambda: ([sys.executable, "-c", "pass"], base_env), [], timed)]
        for command in ("--version", "search", "serve"):
            cases += [(f"{command}: {side.label}", side.prepare) + commands(side)[command] for side in all_sides]
        times = {label: [] for label, _, _, _ in cases}
        hits = {}
        for _ in range(args.rounds):
            for label, prepare, flags, how in cases:
                argv, env = prepare()
                seconds, stdout = how(argv + flags, env)
                times[label].append(seconds)
                if label.startswith("search"):
                    hits[label] = sum(1 for line in stdout.splitlines() if line.startswith("{"))
        return report(args, times, hits, query)
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)
        if not args.kb_dir:
            shutil.rmtree(work, ignore_errors=True)


def report(args, times, hits, query):
    bare = statistics.median(times["python -c pass"])
    rows, summary = [], {"chunks": args.chunks, "rounds": args.rounds, "query": query, "python": sys.version.split()[0],
                         "ms": {}, "x_bare": {}}
    for label, samples in times.items():
        ms = statistics.median(samples) * 1000
        summary["ms"][label] = round(ms, 1)
        summary["x_bare"][label] = round(ms / (bare * 1000), 2)
        rows.append((label, "%.1f" % ms, "%.1f" % min(s * 1000 for s in samples), "%.2fx" % (ms / (bare * 1000)),
                     str(hits.get(label, ""))))
    print(f"\n== start-up, {args.rounds} rounds, Python {summary['python']}; KB of {args.chunks} chunks, "
          f"query {query!r}")
    print_table(("process", "median ms", "min ms", "x bare", "hits"), rows)
    verdicts = []
    for command, limit in TARGETS.items():
        for form in ("python ragproxy.py, warm", "python ragproxy.pyz, warm"):
            ratio = summary["x_bare"].get(f"{command}: {form}")
            if ratio is not None:
                verdict = "met" if ratio <= limit else "MISSED"
                verdicts.append(f"{command} ({form}): {ratio:.2f}x bare, target {limit}x: {verdict}")
    print("\n".join(verdicts))
    summary["verdicts"] = verdicts
    return summary


def parse_args(argv):
    p = argparse.ArgumentParser(description="ragproxy start-up: script and .pyz, cold and warm, next to bare Python")
    p.add_argument("--chunks", type=int, default=100_000, help="chunks in the search KB (default 100000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds of every case (default 7)")
    p.add_argument("--kb-dir", help="where to build (and next time reuse) the KB; default a temporary directory")
    p.add_argument("--compare", action="append", default=[],
                   help="another ragproxy.py (with whatever sits beside it) or .pyz to run as a further side, "
                        "with a KB it builds itself; repeatable")
    p.add_argument("--ragproxy", default=os.path.join(ROOT, "ragproxy.py"),
                   help="the ragproxy.py of the checkout to measure (default: this one)")
    p.add_argument("--json", action="store_true", help="after the table, one JSON line with every figure")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    summary = run(args)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
