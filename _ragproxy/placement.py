"""Which CPU the threads serving connections run on: one, chosen by load, moved when it gets busy.

Python runs one thread at a time (the GIL), and a proxy's connection threads
hand it to each other several times a request: at each socket call, and around
each of numpy's array operations.  When those threads sit on different CPUs,
each hand-off wakes a thread on the other CPU (an inter-processor interrupt;
on a virtual machine, an exit to the hypervisor) and the request's data
follows it from cache to cache.  On one CPU it is a plain context switch.
Measured with bench/proxy_overhead.py (2 vCPUs, 16 clients each asking a new
question of an 80k-chunk knowledge base): CPU per request 1,666 -> 1,280 us,
added p50 +19.1 -> +11.7 ms (bench/RESULTS.md, session 32).

Only the connection threads are placed.  The indexer, the request log's
writer, numpy's BLAS threads and a dense scan's helper threads (which call
``free_thread``) keep the process's CPUs: their work runs beside the
requests' instead of taking turns with it.

The CPU is chosen at start, a different one for each of ``serve --workers``'s
workers (by slot), and looked at again every LOOK_INTERVAL seconds or so.
When other processes keep it busier than another CPU by more than MOVE_MARGIN
of a CPU, every connection thread moves to the least busy one.  A machine
busy on every CPU (a local model generating) moves nothing.

``server.cpu_pinning: off`` places nothing; nor does a process allowed one
CPU, or a system without ``os.sched_setaffinity`` (Linux has it).
``state()`` says which, and why.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time

log = logging.getLogger("ragproxy")

#: A move needs other processes' load on the current CPU to exceed the least busy CPU's by this
#: much (in CPUs): enough that a brief burst elsewhere, or our own unplaced threads, move nothing.
MOVE_MARGIN = 0.5
#: Seconds between looks at the CPUs' load, each drawn from 0.75-1.25 times this, so that
#: workers which collided on a CPU do not all move, and back, together.
LOOK_INTERVAL = 2.0


def choose_cpu(current, load, own, margin=MOVE_MARGIN):
    """The CPU the connection threads should run on next: ``current``, unless another is idler.

    ``load`` maps each allowed CPU to how busy it was over the last look's window (0.0-1.0, every
    process's work); ``own`` is this process's share of it, which ran on ``current``.  The least
    busy other CPU is chosen (the lowest number among equals) when ``current`` carries more than
    ``margin`` of a CPU more of other processes' work than it.
    """
    others_here = max(0.0, load[current] - own)
    idlest = min((cpu for cpu in load if cpu != current), key=lambda cpu: (load[cpu], cpu), default=None)
    if idlest is None or others_here - load[idlest] <= margin:
        return current
    return idlest


def free_thread():
    """Let the calling thread run on every CPU the process may use.

    For threads a placed connection thread starts to run beside it (they inherit its one CPU):
    the process's CPUs are its main thread's, which is never placed.
    """
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, os.sched_getaffinity(os.getpid()))
        except OSError:   # the set changed under us (a cpuset): stay where we are
            pass


class LinuxCpus:
    """The operating system's side: the CPUs' load and the threads' affinity (Linux)."""

    STAT = "/proc/stat"

    @staticmethod
    def supported():
        return hasattr(os, "sched_setaffinity") and os.path.exists(LinuxCpus.STAT)

    @staticmethod
    def allowed():
        return sorted(os.sched_getaffinity(0))

    @staticmethod
    def pin(thread_id, cpus):
        os.sched_setaffinity(thread_id, cpus)

    @staticmethod
    def thread_id():
        return threading.get_native_id()

    def ticks(self):
        """``{cpu: (busy, total)}`` clock ticks since boot, from /proc/stat."""
        out = {}
        with open(self.STAT, "rb") as f:
            for line in f:
                if not line.startswith(b"cpu") or line.startswith(b"cpu "):
                    continue
                name, *fields = line.split()
                # user nice system idle iowait irq softirq steal: time stolen by the hypervisor is
                # time this CPU did not run us either, so it counts as busy.
                values = [int(v) for v in fields[:8]]
                idle = values[3] + values[4]
                out[int(name[3:])] = (sum(values) - idle, sum(values))
        return out

    @staticmethod
    def process_seconds():
        times = os.times()
        return times.user + times.system


class CpuPlacement:
    """Where this process's connection threads run (see the module docstring).

    ``mode``: ``auto`` or ``off`` (server.cpu_pinning); ``slot``: this worker's (0 alone).
    ``system``, ``clock``, ``rand`` and ``interval`` are the operating system, the wall clock,
    the looks' jitter and their mean interval, for tests.  The server calls ``enter_thread``
    and ``leave_thread`` from each connection thread; ``run`` looks at the load until its stop
    event is set.
    """

    def __init__(self, mode="auto", slot=0, system=None, clock=time.monotonic, rand=random.random,
                 interval=LOOK_INTERVAL):
        self.system = LinuxCpus() if system is None else system
        self.clock, self.rand, self.interval = clock, rand, interval
        self.cpu = None         # the CPU the connection threads are on; None: not placed
        self.reason = ""        # why not, when not
        self.moves = 0
        self._lock = threading.Lock()
        self._threads = set()   # thread ids placed on self.cpu
        self._last = None       # (wall time, process seconds, ticks) at the last look
        self._allowed = []
        if mode == "off":
            self.reason = "server.cpu_pinning is off"
        elif not self.system.supported():
            self.reason = "this system cannot set a thread's CPU"
        else:
            self._allowed = self.system.allowed()
            if len(self._allowed) < 2:
                self.reason = "the process may use one CPU"
            else:
                self.cpu = self._allowed[slot % len(self._allowed)]

    def state(self):
        """``{"cpu": n or None, "threads": placed now, "moves": n, "reason": why not placed ("" if placed)}``."""
        return {"cpu": self.cpu, "threads": len(self._threads), "moves": self.moves, "reason": self.reason}

    def describe(self):
        """One line for the log at start-up."""
        if self.cpu is None:
            return "connection threads not placed on a CPU: " + self.reason
        return (f"connection threads placed on CPU {self.cpu} of {len(self._allowed)} "
                "(server.cpu_pinning: auto; moved if other work keeps it busy)")

    def samples(self):
        """Collector samples for /metrics (ragproxy_serving_cpu, ragproxy_serving_cpu_moves_total)."""
        return [("ragproxy_serving_cpu", {}, -1 if self.cpu is None else self.cpu),
                ("ragproxy_serving_cpu_moves_total", {}, self.moves)]

    def enter_thread(self):
        """Place the calling connection thread on the chosen CPU."""
        if self.cpu is None:
            return
        with self._lock:
            if self.cpu is None:
                return
            thread_id = self.system.thread_id()
            try:
                self.system.pin(thread_id, {self.cpu})
            except OSError as exc:   # the allowed CPUs changed (a cpuset), or we may not: stop placing
                self._give_up(f"placing a thread on CPU {self.cpu} failed: {exc.strerror or exc}")
                return
            self._threads.add(thread_id)

    def leave_thread(self):
        """The calling connection thread is ending: forget it."""
        if self.cpu is None and not self._threads:
            return
        with self._lock:
            self._threads.discard(self.system.thread_id())

    def run(self, stop):
        """Look at the CPUs' load every ``interval`` seconds or so until ``stop`` (an Event) is set."""
        while self.cpu is not None and not stop.wait(self.interval * (0.75 + 0.5 * self.rand())):
            try:
                self.look()
            except Exception as exc:   # an unreadable /proc must not end the server
                with self._lock:
                    self._give_up(f"reading the CPUs' load failed: {exc!r}")

    def look(self):
        """Compare the CPUs' load since the last look and move the connection threads if it pays."""
        if self.cpu is None:
            return
        now, own, ticks = self.clock(), self.system.process_seconds(), self.system.ticks()
        last, self._last = self._last, (now, own, ticks)
        if last is None or now <= last[0]:
            return
        load = {}
        for cpu in self._allowed:
            if cpu not in ticks or cpu not in last[2]:
                continue
            busy, total = ticks[cpu][0] - last[2][cpu][0], ticks[cpu][1] - last[2][cpu][1]
            if total > 0:
                load[cpu] = busy / total
        if self.cpu not in load:
            return
        own_share = (own - last[1]) / (now - last[0])
        was = self.cpu
        target = choose_cpu(was, load, own_share)
        if target != was and self.move_to(target):
            log.info("connection threads moved from CPU %d to CPU %d: other work kept CPU %d %.0f%% busy, "
                     "CPU %d %.0f%%", was, target, was, 100 * max(0.0, load[was] - own_share), target,
                     100 * load[target])

    def move_to(self, target):
        """Move every connection thread, and those to come, to CPU ``target``; whether they moved."""
        with self._lock:
            if self.cpu is None:
                return False
            for thread_id in list(self._threads):
                try:
                    self.system.pin(thread_id, {target})
                except ProcessLookupError:   # ended between its last request and leave_thread
                    self._threads.discard(thread_id)
                except OSError as exc:
                    self._give_up(f"moving a thread to CPU {target} failed: {exc.strerror or exc}")
                    return False
            self.cpu = target
            self.moves += 1
            # The window of the next look straddles the move: start it afresh.
            self._last = None
        return True

    def _give_up(self, reason):
        """Stop placing (the lock held): threads placed so far get every allowed CPU back."""
        for thread_id in list(self._threads):
            try:
                self.system.pin(thread_id, set(self._allowed))
            except OSError:
                pass
        self._threads.clear()
        self.cpu = None
        self.reason = reason
        log.warning("connection threads are no longer placed on a CPU: %s", reason)
