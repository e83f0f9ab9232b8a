"""Several serving processes on one listening socket: the supervisor that forks, watches and restarts them.

One ragproxy process is bound by its interpreter lock once a few clients ask
for retrieval at once (bench/RESULTS.md, issue 20: a new question on the chat
body at 16 clients, 968 requests/s from one process, 1,550 from two).
``serve --workers N`` (server.workers) binds the socket once, then forks N
workers that each run a whole ragproxy on it (``run_worker(slot, ready)``,
given by cli); the kernel hands each new connection to one of them.  A worker
calls ``ready()`` once it serves: till then the status file calls it
"starting", then "running".  What the workers
must share they share through files under DATA_DIR/run (metrics, the login
throttle, the indexer's requests and status) or by a key (MCP session ids);
this module knows none of it.

The supervisor serves nothing.  It stays single-threaded, so forking a
replacement worker never copies a thread that holds a lock: it waits on a
pipe that the signal handlers' wake-up byte lands in (signal.set_wakeup_fd),
with a timeout for the next restart due.  SIGTERM and SIGINT stop the workers
(SIGTERM, then SIGKILL after ``stop_timeout``) and then itself; SIGHUP is
passed on (each worker reloads its config).  A worker that exits while not
asked to is logged with how it ended and started again in its slot: at once
if it had run for ``steady_seconds``, else after a wait that doubles up to
``max_backoff`` (a worker that dies at start-up must not spin).  Each change
is written to the status file (run/workers.json, see read_status), which
every worker's admin API and panel show.

May import: files.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import sys
import time

from .files import atomic_write

log = logging.getLogger("ragproxy")

#: The status file's name under the run directory.
STATUS_FILE = "workers.json"


def describe_exit(status):
    """How a process ended, from its wait status: "exited with status 1", "was killed by SIGKILL"."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name}"


class _Worker:
    """One slot's process, as the supervisor knows it."""

    def __init__(self, slot):
        self.slot = slot
        self.pid = None
        self.started = None        # wall clock, for the status file
        self.started_at = None     # monotonic, for the back-off
        self.restarts = 0
        self.last_exit = None      # describe_exit's words
        self.last_exit_at = None
        self.backoff = 0.0         # the wait before the next restart, if the next exit is early too
        self.due = None            # monotonic time of a restart waiting out its back-off
        self.ready = False         # it said it serves (its ready() byte arrived)
        self.ready_fd = None       # the read end of its ready pipe, until the byte or EOF

    def as_dict(self):
        state = ("running" if self.ready else "starting") if self.pid else "restarting"
        return {"slot": self.slot, "pid": self.pid, "state": state,
                "started": self.started, "restarts": self.restarts, "last_exit": self.last_exit,
                "last_exit_at": self.last_exit_at}


class Supervisor:
    """Forks ``count`` workers that each call ``run_worker(slot, ready)`` and exit with what it returns.

    ``status_path`` is where the workers' state is written for the admin API
    (None: nowhere).  ``clock`` stamps it, ``monotonic`` times back-off and
    the stop; ``fork`` and ``kill`` are os's (injectable for tests).
    """

    def __init__(self, run_worker, count, status_path=None, clock=time.time, monotonic=time.monotonic,
                 stop_timeout=20.0, steady_seconds=10.0, max_backoff=30.0, fork=os.fork, kill=os.kill):
        if count < 1:
            raise ValueError("a supervisor needs at least one worker")
        self.run_worker = run_worker
        self.workers = [_Worker(slot) for slot in range(count)]
        self.status_path = status_path
        self.clock, self.monotonic = clock, monotonic
        self.stop_timeout, self.steady_seconds, self.max_backoff = stop_timeout, steady_seconds, max_backoff
        self.fork, self.kill = fork, kill
        self.started = clock()
        self._stopping = False
        self._reload = False
        self._wake_r = self._wake_w = None
        self._selector = None

    # -- the loop -----------------------------------------------------------

    def run(self):
        """Start every worker, keep them running until SIGTERM or SIGINT, stop them; 0 when done."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in self._signals()}
        old_wakeup = signal.set_wakeup_fd(self._wake_w)
        selector = self._selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            for worker in self.workers:
                self._start(worker)
            self._write_status()
            while not self._stopping:
                for key, _ in selector.select(self._next_timeout()):
                    if key.data is not None:
                        self._heard(key.data)
                self._drain_wakeups()
                if self._reload:
                    self._reload = False
                    self._signal_all(signal.SIGHUP)
                self._reap()
                self._restart_due()
            self._stop_all(selector)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for worker in self.workers:
                self._forget_ready_pipe(worker)
            selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._write_status(stopped=True)
        return 0

    @staticmethod
    def _signals():
        wanted = [signal.SIGTERM, signal.SIGINT, signal.SIGCHLD]
        return wanted + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])

    def _on_signal(self, signum, frame):
        # Runs in the main thread between bytecodes; the wake-up byte has already ended the select.
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stopping = True
        elif signum == getattr(signal, "SIGHUP", None):
            self._reload = True

    def _drain_wakeups(self):
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self._wake_r, 512):
                pass

    def _next_timeout(self):
        due = [w.due for w in self.workers if w.due is not None]
        # Without a restart due, a bounded wait still looks at the children now and then, in case a
        # SIGCHLD was coalesced with one already handled.
        return max(0.0, min(due) - self.monotonic()) if due else 1.0

    # -- workers ------------------------------------------------------------

    def _start(self, worker):
        worker.due = None
        ready_r, ready_w = os.pipe()
        try:
            pid = self.fork()
        except OSError as exc:  # the process table or memory is full: try again, as after an early exit
            os.close(ready_r)
            os.close(ready_w)
            worker.backoff = min(self.max_backoff, max(1.0, worker.backoff * 2))
            worker.due = self.monotonic() + worker.backoff
            log.error("cannot start worker %d: %s; trying again in %g s", worker.slot, exc.strerror or exc,
                      worker.backoff)
            return
        if pid == 0:
            os.close(ready_r)
            self._become_worker(worker.slot, ready_w)  # never returns
        os.close(ready_w)
        worker.pid, worker.started, worker.started_at = pid, self.clock(), self.monotonic()
        worker.ready, worker.ready_fd = False, ready_r
        self._selector.register(ready_r, selectors.EVENT_READ, worker)
        log.debug("worker %d started, pid %d", worker.slot, pid)

    def _heard(self, worker):
        """Its ready pipe is readable: the byte (it serves), or EOF (it exited first; _reap tells)."""
        try:
            said = os.read(worker.ready_fd, 1)
        except OSError:
            said = b""
        self._forget_ready_pipe(worker)
        if said and worker.pid:
            worker.ready = True
            log.debug("worker %d (pid %d) serves", worker.slot, worker.pid)
            self._write_status()

    def _forget_ready_pipe(self, worker):
        if worker.ready_fd is not None:
            self._selector.unregister(worker.ready_fd)
            os.close(worker.ready_fd)
            worker.ready_fd = None

    def _become_worker(self, slot, ready_w):
        code = 1

        def ready():
            with contextlib.suppress(OSError):
                os.write(ready_w, b"r")
                os.close(ready_w)

        try:
            signal.set_wakeup_fd(-1)
            os.close(self._wake_r)
            os.close(self._wake_w)
            for worker in self.workers:   # the siblings' ready pipes are the supervisor's
                if worker.ready_fd is not None:
                    os.close(worker.ready_fd)
            self._selector.close()
            for sig in self._signals():
                signal.signal(sig, signal.SIG_DFL)
            code = self.run_worker(slot, ready)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            log.exception("worker %d failed", slot)
        finally:
            with contextlib.suppress(Exception):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            # Not sys.exit: the supervisor's own finally blocks and atexit hooks belong to it alone.
            os._exit(code if isinstance(code, int) else 1)

    def _reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = next((w for w in self.workers if w.pid == pid), None)
            if worker is None:
                continue  # not a worker (a child of run_worker's caller, say): nothing to restart
            self._exited(worker, status)

    def _exited(self, worker, status):
        how, pid = describe_exit(status), worker.pid
        worker.pid, worker.ready = None, False
        self._forget_ready_pipe(worker)
        worker.last_exit, worker.last_exit_at = how, self.clock()
        if self._stopping:
            log.debug("worker %d %s", worker.slot, how)
            self._write_status()
            return
        lived = self.monotonic() - worker.started_at
        worker.backoff = 0.0 if lived >= self.steady_seconds else min(self.max_backoff, max(1.0, worker.backoff * 2))
        worker.due = self.monotonic() + worker.backoff
        log.warning("worker %d (pid %d) %s after %.1f s; starting it again%s", worker.slot, pid, how, lived,
                    f" in {worker.backoff:g} s" if worker.backoff else "")
        self._write_status()

    def _restart_due(self):
        now = self.monotonic()
        started = False
        for worker in self.workers:
            if worker.pid is None and worker.due is not None and worker.due <= now and not self._stopping:
                worker.restarts += 1
                self._start(worker)
                started = True
        if started:
            self._write_status()

    def _signal_all(self, sig):
        for worker in self.workers:
            if worker.pid:
                with contextlib.suppress(ProcessLookupError):
                    self.kill(worker.pid, sig)

    def _stop_all(self, selector):
        """SIGTERM to every worker; SIGKILL to those still running after stop_timeout."""
        for worker in self.workers:
            worker.due = None
        self._signal_all(signal.SIGTERM)
        deadline = self.monotonic() + self.stop_timeout
        while any(w.pid for w in self.workers):
            left = deadline - self.monotonic()
            if left <= 0:
                for worker in self.workers:
                    if worker.pid:
                        log.warning("worker %d (pid %d) did not stop within %g s; killing it", worker.slot,
                                    worker.pid, self.stop_timeout)
                self._signal_all(signal.SIGKILL)
                deadline = self.monotonic() + self.stop_timeout
            for key, _ in selector.select(min(max(left, 0.0), 0.5)):
                if key.data is not None:
                    self._heard(key.data)   # EOF, mostly: a worker ending
            self._drain_wakeups()
            self._reap()

    # -- the status file ----------------------------------------------------

    def status(self, stopped=False):
        return {"supervisor_pid": os.getpid(), "started": self.started, "count": len(self.workers),
                "stopped": stopped, "workers": [w.as_dict() for w in self.workers]}

    def _write_status(self, stopped=False):
        if self.status_path is None:
            return
        try:
            atomic_write(self.status_path, json.dumps(self.status(stopped), indent=1).encode("utf-8"), 0o644,
                         fsync=False)
        except OSError as exc:
            log.warning("cannot write the workers' status to %s: %s", self.status_path, exc.strerror or exc)


def read_status(path):
    """The supervisor's status file as a dict, or None when there is none (a single process)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"error": f"cannot read {os.path.basename(path)}: {exc}"}
    return data if isinstance(data, dict) else {"error": f"{os.path.basename(path)} is not a JSON object"}
