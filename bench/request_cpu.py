#!/usr/bin/env python3
"""The proxy's own CPU per request, in process: an A/B quieter than proxy_overhead.py.

proxy_overhead.py measures what a client sees, with three processes on two
CPUs; on a shared VM its run-to-run scatter (about +-0.8 ms p50 at 8 clients)
hides a change of tens of microseconds.  This calls App.handle directly, one
request after another, and reads the thread's CPU clock around each batch:
what ragproxy itself spends on a request, with no load generator, scheduler
or other connection in the figure.

Every --ragproxy runs in a worker process of its own (two versions of
_ragproxy cannot share one), against the same fake upstream and a copy of the
same knowledge base; the batches alternate between versions and sides, so a
change in the machine's speed lands on all of them alike.

    python bench/request_cpu.py                                  # chat + claude, every side
    python bench/request_cpu.py --ragproxy /tmp/base/ragproxy.py --ragproxy ragproxy.py   # an A/B
    python bench/request_cpu.py --scenarios claude --sides pass,cached --profile cached --profile-out p.prof
    python bench/request_cpu.py --scenarios chat --sides fresh --threads 8            # under concurrency
    python bench/request_cpu.py --scenarios claude --sides pass-round,cached --bytecodes --requests 20

Sides: pass (a model without knowledge bases), rag (the same question every
time: the search and render caches answer), cached (the next tool round of
the same turn), fresh (a new question every time: a BM25 search), and, on
request, pass-round (cached's own tool-round body to a model without
knowledge bases: what the tool round costs beyond forwarding it), loop (an
agent loop's rounds one after another: each request the body before it with
a tool call and its result more, Claude Code's cache mark moved onto the
newest message, over --loop-rounds rounds and then from the turn's first
request again, whose question the search cache answers) and pass-loop (the
same bodies to a model without knowledge bases).  cached sends one tool
round's body again and again, which no client does: what a growing body
costs (the parse, the turn key's cut markers) is only in loop.  Bodies,
fake upstream and KB are proxy_overhead.py's (the 80k-chunk KB by default,
built once into --cache-dir).  The request log's writer thread and the
indexer are not in the figure (other threads).

--instructions counts instead of timing: each worker runs under valgrind's
cachegrind (which must be installed), twice per side and version, with
--requests and with four times as many after the warm-up, and the extra
requests' share of the difference is printed: instructions, first-level
instruction and data cache misses per request, of the whole process (the
request log's writer thread is in these).  The same code gives the same
count to within about 1%, run after run and whatever else the machine does,
where thread CPU scatters by tens of microseconds: what a cut of a few
microseconds needs.  About fifty times slower than running natively: use
--requests 100.

--bytecodes counts what the interpreter runs instead: each worker traces
--requests requests of each side (after the warm-up) with sys.settrace's
opcode events, on the thread that serves them, and prints the bytecodes per
request of every Python function, its own and with what it called, those
that differ most from the first column (the first side, of the first
version) first.  The count repeats to within a few bytecodes a request
(caches' bookkeeping), so it shows where
a difference between two sides or versions lies, function by function,
which cachegrind (C functions only: the interpreter's loop, whatever it
runs) and cProfile (whose per-call cost swamps small functions) cannot.
What C code runs is not in it: a JSON parse or a memcmp counts one bytecode.

--threads N calls App.handle from N threads at once, each with questions of
its own, and reads the process's CPU clock instead (the request log's writer
and the garbage collector are then in the figure) and its context switches
per request: what concurrency adds, GIL hand-offs above all, without the
load generator and the sockets of proxy_overhead.py.  Each worker sets the
cyclic garbage collector's threshold and the thread switch interval as
`serve` does for the version it runs (Python's defaults for a version that
sets none); --gc-threshold sets another threshold for every version.

Standard library only; Python 3.9+.
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import proxy_overhead as po  # noqa: E402
from request_body import agent_loop_rounds  # noqa: E402

SIDES = ("pass", "rag", "cached", "fresh", "pass-round", "loop", "pass-loop")
DEFAULT_SIDES = ("pass", "rag", "cached", "fresh")
SCENARIOS = ("chat", "claude")
PASS_MODEL = "pass-through"


# A thread's new questions are numbered from its own multiple of this: no two threads ask the same.
_QUESTIONS_PER_THREAD = 10 ** 8


def request_body(scenario, side, body_bytes, first=0, loop_rounds=16):
    """The bytes the load generator would send, less the head: a body, or a callable for a new one each
    time (new questions numbered from ``first``; a loop's next round)."""
    model = PASS_MODEL if side in ("pass", "pass-round", "pass-loop") else po.CLAUDE_MODEL
    if side in ("loop", "pass-loop"):
        rounds = itertools.cycle(agent_loop_rounds(scenario, request_body(scenario, "pass", body_bytes),
                                                   loop_rounds, model))
        return lambda: next(rounds)
    tool_round, fresh = side in ("cached", "pass-round"), side == "fresh"
    if scenario == "claude":
        sent = po.messages_bytes(0, body_bytes, tool_round=tool_round, fresh=fresh, model=model)
    else:
        sent = po.request_bytes(0, False, 1000, model, tool_round=tool_round, fresh=fresh)
    if callable(sent):
        sent.count = first
        return lambda: sent().split(b"\r\n\r\n", 1)[1]
    return sent.split(b"\r\n\r\n", 1)[1]


def _context_switches():
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def worker_role(opts):
    """Serve batches on stdin ("SCENARIO SIDE N [warm]") with one App; answer "ok CPU_US INJECTED SWITCHES"
    per batch, SWITCHES being context switches per request (a warm-up batch is left out of --profile)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(opts.ragproxy)))
    import ragproxy

    threshold = opts.gc_threshold
    if threshold is None:
        try:
            from _ragproxy.cli import SERVE_GC_THRESHOLD as threshold
        except ImportError:   # a version whose serve leaves the collector as Python sets it
            threshold = None
    if threshold is not None:
        gc.set_threshold(threshold, *gc.get_threshold()[1:])
    try:
        from _ragproxy.cli import SERVE_SWITCH_INTERVAL
    except ImportError:   # a version whose serve leaves the switch interval as Python sets it
        pass
    else:
        sys.setswitchinterval(SERVE_SWITCH_INTERVAL)
    with open(opts.config, encoding="utf-8") as f:
        config = ragproxy.Config.from_text(f.read())
    app = ragproxy.App(config, data_dir=opts.data)
    headers = {"authorization": "Bearer " + po.API_KEY, "content-type": "application/json",
               "anthropic-version": "2023-06-01"}
    paths = {"chat": "/v1/chat/completions", "claude": "/v1/messages"}
    bodies = {}
    profile = None
    if opts.profile_out:
        import cProfile
        profile = cProfile.Profile(time.thread_time)

    def one(scenario, side, thread=0):
        body = bodies.get((scenario, side, thread))
        if body is None:
            body = bodies[scenario, side, thread] = request_body(scenario, side, opts.body_bytes,
                                                                 thread * _QUESTIONS_PER_THREAD, opts.loop_rounds)
        request = ragproxy.Request("POST", paths[scenario], "", headers, body() if callable(body) else body,
                                   "127.0.0.1")
        response = app.handle(request)
        if response.after is not None:   # the request log and metrics, as the server runs them after sending
            response.after()
        if response.status != 200:
            raise RuntimeError(f"{scenario} {side}: HTTP {response.status}: {response.body[:300]!r}")
        return any(name.lower() == "x-ragproxy-sources" for name, _ in response.headers)

    print("ready", flush=True)
    try:
        for line in sys.stdin:
            scenario, side, count, *flags = line.split()
            warm = "warm" in flags
            if "bytecodes" in flags:
                tally = BytecodeTally(os.path.dirname(os.path.abspath(opts.ragproxy)))
                with tally:
                    for _ in range(int(count)):
                        one(scenario, side)
                print("bytecodes " + json.dumps(tally.per_request(int(count)), separators=(",", ":")), flush=True)
                continue
            profiling = profile is not None and side == opts.profile and not warm
            if profiling:
                profile.enable()
            switched = _context_switches()
            if opts.threads == 1:
                started = time.thread_time()
                injected = sum(one(scenario, side) for _ in range(int(count)))
                spent = time.thread_time() - started
            else:
                started = time.process_time()
                injected = _in_threads(one, scenario, side, int(count), opts.threads)
                spent = time.process_time() - started
            switched = _context_switches() - switched
            if profiling:
                profile.disable()
            print(f"ok {spent / int(count) * 1e6:.2f} {injected} {switched / int(count):.2f}", flush=True)
    finally:
        if profile is not None:
            profile.dump_stats(opts.profile_out)
        app.close()


class BytecodeTally:
    """The bytecodes each Python function runs on this thread while the tally is on (``with``):
    sys.settrace's opcode events, ``own`` those of the function's frames, ``inclusive`` with every
    frame they called (a recursive function's inner frames counted once).  Functions are named
    ``qualname (path)``, the path relative to ``root`` (or to the bench's checkout) when under it,
    so that two versions' functions pair up; ``name (path:line)`` on a Python without qualnames."""

    def __init__(self, root):
        self.roots = [os.path.join(os.path.abspath(path), "") for path in (root, os.path.dirname(HERE))]
        self.total = 0
        self.own = collections.Counter()
        self.inclusive = collections.Counter()
        self._names = {}
        self._stack = []                       # (name, total at the call, outermost frame of its name)
        self._open = collections.Counter()     # frames of each name on the stack

    def _name(self, code):
        name = self._names.get(code)
        if name is None:
            path = code.co_filename
            root = next((root for root in self.roots if path.startswith(root)), None)
            path = path[len(root):] if root else os.path.basename(path)
            qualname = getattr(code, "co_qualname", None)   # Python 3.11+
            name = self._names[code] = (f"{qualname} ({path})" if qualname
                                        else f"{code.co_name} ({path}:{code.co_firstlineno})")
        return name

    def _call(self, frame, event, arg):
        if event == "call":
            name = self._name(frame.f_code)
            self._stack.append((name, self.total, not self._open[name]))
            self._open[name] += 1
            frame.f_trace_opcodes = True
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "opcode":
            self.total += 1
            self.own[self._name(frame.f_code)] += 1
        elif event == "return" and self._stack:   # also when an exception leaves the frame
            name, at_call, outermost = self._stack.pop()
            self._open[name] -= 1
            if outermost:
                self.inclusive[name] += self.total - at_call
        return self._local

    def __enter__(self):
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)

    def per_request(self, requests):
        """``{"total": n, "functions": {name: [own, inclusive]}}``, per request."""
        names = set(self.own) | set(self.inclusive)
        return {"total": self.total / requests,
                "functions": {name: [self.own[name] / requests, self.inclusive[name] / requests] for name in names}}


def _in_threads(one, scenario, side, count, threads):
    """``count`` requests shared out among ``threads`` threads, started together; how many injected."""
    injected = [0] * threads
    failed = []
    start = threading.Barrier(threads + 1)

    def run(thread, n):
        start.wait()
        try:
            injected[thread] = sum(one(scenario, side, thread + 1) for _ in range(n))
        except Exception as exc:   # reported by the batch, not lost in a thread
            failed.append(exc)

    shares = [count // threads + (1 if t < count % threads else 0) for t in range(threads)]
    running = [threading.Thread(target=run, args=(t, n)) for t, n in enumerate(shares)]
    for thread in running:
        thread.start()
    start.wait()
    for thread in running:
        thread.join()
    if failed:
        raise failed[0]
    return sum(injected)


class Worker:
    """A worker process for one ragproxy.py, with its own copy of the KB; ``wrapper``, a command
    it runs under (cachegrind's)."""

    def __init__(self, opts, script, label, upstream_port, workdir, kb, profile_out, wrapper=()):
        data, section, self.kb_facts = po.prepare_kb(kb, opts, script, workdir)
        config = os.path.join(data, "request_cpu.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(po.proxy_config(upstream_port, section, plain_models=(PASS_MODEL,)))
        argv = [opts.python, os.path.abspath(__file__), "--role", "worker", "--ragproxy", script, "--data", data,
                "--config", config, "--body-bytes", str(opts.body_bytes), "--threads", str(opts.threads),
                "--loop-rounds", str(opts.loop_rounds)]
        if opts.gc_threshold is not None:
            argv += ["--gc-threshold", str(opts.gc_threshold)]
        if profile_out:
            argv += ["--profile", opts.profile, "--profile-out", profile_out]
        env = dict(os.environ, RAGPROXY_SECRET_KEY="bench-secret")
        env.pop("RAGPROXY_CHECK_SHARED", None)   # a copy per use: not what a user's proxy spends
        if wrapper:
            # OpenBLAS's idle threads spin under valgrind for as long as the run lasts (natively they
            # sleep), which would count as the requests' instructions: one thread does the same work.
            env["OPENBLAS_NUM_THREADS"] = "1"
        self.label, self.script = label, script
        self.proc = subprocess.Popen(list(wrapper) + argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError(f"worker for {script} did not start")

    def batch(self, scenario, side, count, warm=False):
        self.proc.stdin.write(f"{scenario} {side} {count}{' warm' if warm else ''}\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        if answer[:1] != ["ok"]:
            self.stop()
            raise RuntimeError(f"worker for {self.script} failed on {scenario} {side} (its stderr says why)")
        return float(answer[1]), int(answer[2]), float(answer[3])

    def bytecodes(self, scenario, side, count):
        """BytecodeTally.per_request for ``count`` requests of ``side``, traced in the worker."""
        self.proc.stdin.write(f"{scenario} {side} {count} bytecodes\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer.startswith("bytecodes "):
            self.stop()
            raise RuntimeError(f"worker for {self.script} failed on {scenario} {side} (its stderr says why)")
        return json.loads(answer[len("bytecodes "):])

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout)
            except Exception:
                self.proc.kill()


# The caches cachegrind simulates, the same on every machine so that counts compare: a common
# first level (32 KB, 8-way, 64-byte lines, for instructions and for data) and a last level of 32 MB.
_SIMULATED_CACHES = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=33554432,16,64")

# cachegrind's events as --instructions reports them: (heading, the events summed).
_COUNTED = (("instructions", ("Ir",)), ("I1 misses", ("I1mr",)), ("D1 misses", ("D1mr", "D1mw")))


def cachegrind_totals(path):
    """``{event: count}`` from a cachegrind output file's ``events:`` and ``summary:`` lines."""
    events = summary = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("summary:"):
                summary = [int(n) for n in line.split()[1:]]
    if not events or summary is None or len(summary) != len(events):
        raise RuntimeError(f"{path} is not a complete cachegrind output file")
    return dict(zip(events, summary))


def count_instructions(opts, labels, upstream_port, workdir, pairs):
    """``({(scenario, side, label): {heading: per request}}, KB facts)`` from two cachegrind runs of each
    (--instructions): what ``3 * --requests`` more requests added, divided among them, so that start-up and
    warm-up cancel out."""
    figures, facts = {}, None
    for label, script in zip(labels, opts.ragproxy):
        for scenario, side in pairs:
            totals = []
            for count in (opts.requests, 4 * opts.requests):
                out = os.path.join(workdir, f"cachegrind-{label}-{scenario}-{side}-{count}.out")
                wrapper = [opts.valgrind, "-q", "--tool=cachegrind", "--cache-sim=yes", *_SIMULATED_CACHES,
                           f"--cachegrind-out-file={out}"]
                worker = Worker(opts, script, label, upstream_port, workdir, opts.kb, None, wrapper)
                facts = facts or worker.kb_facts
                try:
                    worker.batch(scenario, side, opts.warmup, warm=True)
                    worker.batch(scenario, side, count)
                finally:
                    worker.stop(timeout=600)   # exiting under valgrind takes a while; the file is written last
                totals.append(cachegrind_totals(out))
            extra = 3 * opts.requests
            figures[scenario, side, label] = {
                heading: sum(totals[1].get(e, 0) - totals[0].get(e, 0) for e in events) / extra
                for heading, events in _COUNTED}
    return figures, facts


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ragproxy", action="append", default=None, metavar="PATH",
                   help="a ragproxy.py to measure; twice or more for an A/B (default: the checkout's)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="chat, claude (default both)")
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                   help="pass, rag, cached, fresh, pass-round, loop, pass-loop (default the first four)")
    p.add_argument("--loop-rounds", type=int, default=16,
                   help="rounds of the loop sides' agent loop before its turn begins again (default 16)")
    p.add_argument("--requests", type=int, default=1000, help="requests per batch (default 1000)")
    p.add_argument("--rounds", type=int, default=5, help="batches per side and version; the median is shown")
    p.add_argument("--warmup", type=int, default=300, help="requests per side before the first batch")
    p.add_argument("--kb", default="80k", choices=sorted(po.KB_SPECS), help="the knowledge base (default 80k)")
    p.add_argument("--kb-docs", type=int, default=0, help="only the first N documents of each corpus")
    p.add_argument("--body-bytes", type=int, default=120_000, help="size of the claude body (default 120000)")
    p.add_argument("--cache-dir", default=os.environ.get("RAGPROXY_BENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ragproxy-bench"),
        help="where the KB is built once (shared with proxy_overhead.py)")
    p.add_argument("--eval-dir", default=po.EVAL_DIR, help="the shared eval corpora (default ../shared/eval)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers and the upstream")
    p.add_argument("--threads", type=int, default=1,
                   help="threads calling App.handle at once (default 1); above 1 the process's CPU is read")
    p.add_argument("--gc-threshold", type=int, default=None, metavar="N",
                   help="the garbage collector's generation-0 threshold in every worker (default: as serve sets it)")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions and cache misses per request under cachegrind instead of timing")
    p.add_argument("--valgrind", default="valgrind", help="with --instructions: the valgrind to run (default valgrind)")
    p.add_argument("--bytecodes", action="store_true",
                   help="count the bytecodes each Python function runs per request instead of timing")
    p.add_argument("--top", type=int, default=25, help="with --bytecodes: how many functions to list (default 25)")
    p.add_argument("--profile", choices=SIDES, help="cProfile this side's batches (thread CPU time)")
    p.add_argument("--profile-out", help="with --profile: the stats file (one per version: .1, .2, ... added)")
    p.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    p.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.ragproxy = [os.path.abspath(path) for path in (opts.ragproxy or [po.RAGPROXY])]
    opts.scenario_list = [s for s in opts.scenarios.split(",") if s]
    opts.side_list = [s for s in opts.sides.split(",") if s]
    for name, given, known in (("scenario", opts.scenario_list, SCENARIOS), ("side", opts.side_list, SIDES)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            p.error(f"unknown {name}(s): {', '.join(unknown)} (choose from {', '.join(known)})")
    if opts.profile and not opts.profile_out:
        p.error("--profile needs --profile-out")
    if not 1 <= opts.threads <= 64:
        p.error("--threads takes 1 to 64")
    if opts.profile and opts.threads > 1:
        p.error("--profile profiles one thread: use it with --threads 1")
    if opts.instructions and (opts.threads > 1 or opts.profile):
        p.error("--instructions counts one thread's requests, unprofiled: not with --threads or --profile")
    if opts.bytecodes and (opts.threads > 1 or opts.profile or opts.instructions):
        p.error("--bytecodes traces one thread's requests: not with --threads, --profile or --instructions")
    if opts.top < 1 or opts.loop_rounds < 1:
        p.error("--top and --loop-rounds take a positive number")
    if opts.instructions and opts.role is None and shutil.which(opts.valgrind) is None:
        p.error(f"--instructions needs valgrind: no {opts.valgrind} on PATH (--valgrind)")
    return opts


def main(argv=None):
    opts = _parse_args(sys.argv[1:] if argv is None else argv)
    if opts.role == "worker":
        opts.ragproxy = opts.ragproxy[0]
        worker_role(opts)
        return 0
    labels = [f"v{i}" for i in range(1, len(opts.ragproxy) + 1)] if len(opts.ragproxy) > 1 else ["ragproxy"]
    clock = "thread" if opts.threads == 1 else "process"
    print("ragproxy request-CPU benchmark (in process, "
          + ("one request at a time)" if opts.threads == 1 else f"{opts.threads} threads at once)"))
    for label, script in zip(labels, opts.ragproxy):
        print(f"  {label}: {po.version_line(opts.python, script, False)}")
    if opts.bytecodes:
        print(f"  traced (sys.settrace opcode events): {opts.requests} requests per side and version after "
              f"{opts.warmup} warm-up requests; bytecodes per request")
    elif opts.instructions:
        print(f"  under cachegrind, per side and version: {opts.requests} and {4 * opts.requests} requests after "
              f"{opts.warmup} warm-up requests, each in a fresh worker; the difference per extra request")
    else:
        print(f"  {opts.rounds} batches of {opts.requests} requests per side and version, interleaved, after "
              f"{opts.warmup} warm-up requests; the median batch's {clock} CPU per request")
    print("  garbage collector threshold: "
          + (f"{opts.gc_threshold} in every worker" if opts.gc_threshold is not None else "as each version's serve")
          + "; thread switch interval: as each version's serve")
    workdir = tempfile.mkdtemp(prefix="ragproxy-request-cpu-")
    upstream, workers = None, []
    try:
        upstream = po.Child([opts.python, os.path.join(HERE, "proxy_overhead.py"), "--role", "upstream"],
                            dict(os.environ), None, "fake upstream")
        pairs = [(scenario, side) for scenario in opts.scenario_list for side in opts.side_list]
        if opts.bytecodes:
            report_bytecodes(opts, labels, pairs, *count_bytecodes(opts, labels, upstream.port, workdir, pairs))
            return 0
        if opts.instructions:
            report_instructions(opts, labels, pairs, *count_instructions(opts, labels, upstream.port, workdir, pairs))
            return 0
        for n, (label, script) in enumerate(zip(labels, opts.ragproxy), 1):
            out = None
            if opts.profile:
                out = opts.profile_out if len(labels) == 1 else f"{opts.profile_out}.{n}"
            workers.append(Worker(opts, script, label, upstream.port, workdir, opts.kb, out))
        facts = workers[0].kb_facts
        print(f"  KB {opts.kb}: {facts['chunks']} chunks from {facts['docs']} documents of "
              f"{' + '.join(facts['corpora'])}")
        for worker in workers:
            for scenario, side in pairs:
                worker.batch(scenario, side, opts.warmup, warm=True)
        figures = {(scenario, side, w.label): [] for scenario, side in pairs for w in workers}
        switches = {key: [] for key in figures}
        injected = dict.fromkeys(figures, 0)
        for _ in range(opts.rounds):
            for scenario, side in pairs:
                for worker in workers:
                    us, hits, switched = worker.batch(scenario, side, opts.requests)
                    figures[scenario, side, worker.label].append(us)
                    switches[scenario, side, worker.label].append(switched)
                    injected[scenario, side, worker.label] += hits
        print_table(pairs, labels, figures, f"{clock} CPU per request (us), median of the batches")
        if opts.threads > 1:
            print_table(pairs, labels, switches, "context switches per request, median of the batches", ".2f")
        if opts.json:
            rows = [{"scenario": scenario, "side": side, "version": label, "script": script,
                     "cpu_us": statistics.median(figures[scenario, side, label]),
                     "switches_per_request": statistics.median(switches[scenario, side, label]),
                     "batches": figures[scenario, side, label], "requests": opts.requests * opts.rounds,
                     "injected": injected[scenario, side, label]}
                    for scenario, side in pairs for label, script in zip(labels, opts.ragproxy)]
            print(json.dumps({"bench": "request_cpu", "python": sys.version.split()[0], "kb": facts,
                              "threads": opts.threads, "gc_threshold": opts.gc_threshold, "results": rows},
                             separators=(",", ":")))
    finally:
        for worker in workers:
            worker.stop()
        if upstream is not None:
            upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def report_instructions(opts, labels, pairs, figures, facts):
    print(f"  KB {opts.kb}: {facts['chunks']} chunks from {facts['docs']} documents of "
          f"{' + '.join(facts['corpora'])}")
    for heading, _ in _COUNTED:
        print_table(pairs, labels, {key: [counts[heading]] for key, counts in figures.items()},
                    f"{heading} per request", ".0f")
    if opts.json:
        rows = [dict({"scenario": scenario, "side": side, "version": label, "script": script},
                     **{heading.replace(" ", "_"): round(figures[scenario, side, label][heading], 1)
                        for heading, _ in _COUNTED})
                for scenario, side in pairs for label, script in zip(labels, opts.ragproxy)]
        print(json.dumps({"bench": "request_cpu", "measure": "instructions", "python": sys.version.split()[0],
                          "kb": facts, "requests": opts.requests, "results": rows}, separators=(",", ":")))


def count_bytecodes(opts, labels, upstream_port, workdir, pairs):
    """``({(scenario, side, label): BytecodeTally.per_request}, KB facts)`` (--bytecodes): each side
    warmed up and then traced in one worker per version."""
    figures, facts = {}, None
    for label, script in zip(labels, opts.ragproxy):
        worker = Worker(opts, script, label, upstream_port, workdir, opts.kb, None)
        facts = facts or worker.kb_facts
        try:
            for scenario, side in pairs:
                worker.batch(scenario, side, opts.warmup, warm=True)
                figures[scenario, side, label] = worker.bytecodes(scenario, side, opts.requests)
        finally:
            worker.stop()
    return figures, facts


def report_bytecodes(opts, labels, pairs, figures, facts):
    """Totals, then the --top functions by their own bytecodes and by inclusive ones: those that differ
    most from the first column (the first side of the first version) when there are two or more."""
    print(f"  KB {opts.kb}: {facts['chunks']} chunks from {facts['docs']} documents of "
          f"{' + '.join(facts['corpora'])}")
    columns = [(scenario, side, label) for scenario, side in pairs for label in labels]
    several = len({scenario for scenario, _ in pairs}) > 1
    titles = [" ".join(part for part in (scenario if several else "", side, label if len(labels) > 1 else "") if part)
              for scenario, side, label in columns]
    width = max(12, *(len(t) + 2 for t in titles))
    functions = [figures[column]["functions"] for column in columns]
    names = set().union(*functions)
    print()
    print("bytecodes per request: " + ", ".join(f"{t} {figures[c]['total']:.0f}" for t, c in zip(titles, columns)))
    for slot, kind in ((0, "own"), (1, "inclusive")):
        def value(n, name, slot=slot):
            return functions[n].get(name, (0.0, 0.0))[slot]
        if len(columns) > 1:
            ranked = sorted(names, key=lambda name: (-max(abs(value(n, name) - value(0, name))
                                                          for n in range(1, len(columns))), name))
            heading = f"the {opts.top} functions whose {kind} bytecodes differ most from {titles[0]}"
        else:
            ranked = sorted(names, key=lambda name: (-value(0, name), name))
            heading = f"the {opts.top} functions that run the most bytecodes, {kind}"
        print()
        print(heading)
        print("".join(f"{t:>{width}}" for t in titles) + "  function")
        for name in ranked[:opts.top]:
            print("".join(f"{value(n, name):>{width}.1f}" for n in range(len(columns))) + "  " + name)
    if opts.json:
        rows = [{"scenario": scenario, "side": side, "version": label, "script": script,
                 "total": figures[scenario, side, label]["total"],
                 "functions": figures[scenario, side, label]["functions"]}
                for scenario, side in pairs for label, script in zip(labels, opts.ragproxy)]
        print(json.dumps({"bench": "request_cpu", "measure": "bytecodes", "python": sys.version.split()[0],
                          "kb": facts, "requests": opts.requests, "results": rows}, separators=(",", ":")))


def print_table(pairs, labels, figures, title, number=".1f"):
    """Medians by scenario and side; with two versions, the second's change from the first."""
    header = f"{'scenario':<9}{'side':<11}" + "".join(f"{label:>12}" for label in labels)
    if len(labels) == 2:
        header += f"{'change':>12}"
    print()
    print(title)
    print(header)
    for scenario, side in pairs:
        medians = [statistics.median(figures[scenario, side, label]) for label in labels]
        row = f"{scenario:<9}{side:<11}" + "".join(f"{m:>12{number}}" for m in medians)
        if len(labels) == 2:
            row += f"{(medians[1] - medians[0]) / medians[0] * 100:>+11.1f}%" if medians[0] else f"{'':>12}"
        print(row)


if __name__ == "__main__":
    sys.exit(main())
