"""Connection threads on one CPU: the choice, the moves, and serve doing it on a real system."""
import http.client
import logging
import os
import re
import threading
import urllib.parse
import urllib.request

import pytest

from _ragproxy import placement
from _ragproxy.placement import MOVE_MARGIN, CpuPlacement, LinuxCpus, choose_cpu
from conftest import API_KEY, ServeProcess, proxy_config, wait_for

linux_with_two_cpus = pytest.mark.skipif(
    not LinuxCpus.supported() or len(os.sched_getaffinity(0)) < 2,
    reason="placing threads needs os.sched_setaffinity and two CPUs the process may use")


# -- the choice ---------------------------------------------------------------

def test_the_current_cpu_stays_while_no_other_is_idler_by_the_margin():
    assert choose_cpu(0, {0: 0.3, 1: 0.0}, own=0.0) == 0
    assert choose_cpu(0, {0: MOVE_MARGIN, 1: 0.0}, own=0.0) == 0   # "more than" the margin


def test_other_work_on_the_current_cpu_moves_the_threads_to_the_idlest():
    assert choose_cpu(0, {0: 0.95, 1: 0.4, 2: 0.1, 3: 0.1}, own=0.0) == 2   # the lowest of equals


def test_the_process_own_work_is_not_a_reason_to_move():
    # Busy with our own requests: moving would only take that work along.
    assert choose_cpu(1, {0: 0.05, 1: 1.0}, own=0.9) == 1
    assert choose_cpu(1, {0: 0.05, 1: 1.0}, own=0.2) == 0


def test_a_machine_busy_on_every_cpu_moves_nothing():
    # A local model generating on every core: no CPU is better than this one.
    assert choose_cpu(0, {0: 1.0, 1: 0.98, 2: 0.99}, own=0.3) == 0


def test_one_cpu_has_nowhere_to_go():
    assert choose_cpu(0, {0: 1.0}, own=0.0) == 0


# -- the placement, against a fake system -------------------------------------

class FakeCpus:
    """An operating system with ``cpus`` CPUs whose load the test sets, recording each pin."""

    def __init__(self, cpus=(0, 1), supported=True):
        self.cpus = list(cpus)
        self.is_supported = supported
        self.pins = []              # (thread id, cpus)
        self.busy = {cpu: 0 for cpu in self.cpus}
        self.total = {cpu: 0 for cpu in self.cpus}
        self.own = 0.0
        self.fail = None            # an OSError to raise from pin
        self.gone = set()           # thread ids that have ended
        self.local = threading.local()

    def supported(self):
        return self.is_supported

    def allowed(self):
        return list(self.cpus)

    def pin(self, thread_id, cpus):
        if self.fail is not None:
            raise self.fail
        if thread_id in self.gone:
            raise ProcessLookupError(3, "No such process")
        self.pins.append((thread_id, set(cpus)))

    def thread_id(self):
        return getattr(self.local, "tid", 1)

    def ticks(self):
        return {cpu: (self.busy[cpu], self.total[cpu]) for cpu in self.cpus}

    def process_seconds(self):
        return self.own

    def run_for(self, seconds, load, own=0.0):
        """``seconds`` pass with each CPU this busy (a fraction), ``own`` CPUs of it ours."""
        for cpu in self.cpus:
            self.total[cpu] += int(seconds * 100)
            self.busy[cpu] += int(seconds * 100 * load.get(cpu, 0.0))
        self.own += own * seconds


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _placed(system, slot=0, mode="auto", interval=2.0):
    clock = Clock()
    return CpuPlacement(mode, slot, system=system, clock=clock, rand=lambda: 0.5, interval=interval), clock


def test_each_worker_starts_on_a_cpu_of_its_own():
    system = FakeCpus(cpus=(2, 3, 5))
    assert [_placed(system, slot)[0].cpu for slot in range(4)] == [2, 3, 5, 2]


def test_a_connection_thread_is_pinned_on_entry_and_forgotten_on_leaving():
    system = FakeCpus()
    cpus, _ = _placed(system, slot=1)
    system.local.tid = 41
    cpus.enter_thread()
    assert system.pins == [(41, {1})]
    assert cpus.state()["threads"] == 1
    cpus.leave_thread()
    assert cpus.state()["threads"] == 0


def test_other_work_moves_every_connection_thread_and_says_so(caplog):
    system = FakeCpus()
    cpus, clock = _placed(system)
    for tid in (7, 8):
        system.local.tid = tid
        cpus.enter_thread()
    cpus.look()                            # the first look only starts the window
    clock.now += 2
    system.run_for(2, {0: 0.9, 1: 0.1}, own=0.1)
    with caplog.at_level(logging.INFO, logger="ragproxy"):
        cpus.look()
    assert cpus.cpu == 1 and cpus.moves == 1
    assert system.pins[2:] == [(7, {1}), (8, {1})] or system.pins[2:] == [(8, {1}), (7, {1})]
    assert "moved from CPU 0 to CPU 1: other work kept CPU 0 80% busy, CPU 1 10%" in caplog.text
    assert cpus.samples() == [("ragproxy_serving_cpu", {}, 1), ("ragproxy_serving_cpu_moves_total", {}, 1)]
    system.local.tid = 9
    cpus.enter_thread()                    # a new connection goes where the others went
    assert system.pins[-1] == (9, {1})


def test_the_window_after_a_move_is_not_judged():
    system = FakeCpus()
    cpus, clock = _placed(system)
    cpus.look()
    clock.now += 2
    system.run_for(2, {0: 0.9})
    cpus.look()
    assert cpus.cpu == 1
    clock.now += 2
    system.run_for(2, {1: 0.9})            # straddles the move: not a reason to go back
    cpus.look()
    assert cpus.cpu == 1 and cpus.moves == 1


def test_our_own_load_keeps_the_threads_where_they_are():
    system = FakeCpus()
    cpus, clock = _placed(system)
    cpus.look()
    clock.now += 2
    system.run_for(2, {0: 1.0, 1: 0.1}, own=0.95)
    cpus.look()
    assert cpus.cpu == 0 and cpus.moves == 0


def test_a_thread_that_ended_unnoticed_does_not_stop_a_move():
    system = FakeCpus()
    cpus, clock = _placed(system)
    for tid in (7, 8):
        system.local.tid = tid
        cpus.enter_thread()
    system.gone.add(7)
    cpus.look()
    clock.now += 2
    system.run_for(2, {0: 0.9})
    cpus.look()
    assert cpus.cpu == 1 and cpus.state()["threads"] == 1


def test_off_one_cpu_and_an_unsupported_system_place_nothing_and_say_why():
    for cpus, reason in ((_placed(FakeCpus(), mode="off")[0], "server.cpu_pinning is off"),
                         (_placed(FakeCpus(cpus=(3,)))[0], "the process may use one CPU"),
                         (_placed(FakeCpus(supported=False))[0], "this system cannot set a thread's CPU")):
        cpus.enter_thread()
        cpus.look()
        assert cpus.system.pins == []
        assert cpus.state() == {"cpu": None, "threads": 0, "moves": 0, "reason": reason}
        assert cpus.samples()[0] == ("ragproxy_serving_cpu", {}, -1)
        assert cpus.describe() == "connection threads not placed on a CPU: " + reason


def test_a_refused_pin_stops_placing_and_gives_placed_threads_every_cpu_back(caplog):
    system = FakeCpus()
    cpus, _ = _placed(system)
    system.local.tid = 7
    cpus.enter_thread()
    system.fail = OSError(22, "Invalid argument")
    system.local.tid = 8
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        cpus.enter_thread()
    assert cpus.cpu is None and "failed: Invalid argument" in cpus.reason
    assert "no longer placed on a CPU" in caplog.text
    system.fail = None
    cpus.enter_thread()                    # and places nothing more
    assert system.pins == [(7, {0})]


def test_run_gives_up_on_an_unreadable_proc_without_ending(caplog):
    system = FakeCpus()
    cpus, _ = _placed(system, interval=0.01)

    def broken():
        raise OSError(5, "Input/output error")
    system.ticks = broken
    stop = threading.Event()
    thread = threading.Thread(target=cpus.run, args=(stop,), daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="ragproxy"):
            thread.start()
            thread.join(5)
    finally:
        stop.set()
    assert not thread.is_alive()
    assert cpus.cpu is None and "reading the CPUs' load failed" in cpus.reason


# -- on this machine ----------------------------------------------------------

def test_proc_stat_reads_as_busy_and_total_ticks_per_cpu():
    if not LinuxCpus.supported():
        pytest.skip("no /proc/stat here")
    ticks = LinuxCpus().ticks()
    assert set(os.sched_getaffinity(0)) <= set(ticks)
    assert all(0 <= busy <= total for busy, total in ticks.values())


@linux_with_two_cpus
def test_real_threads_are_pinned_moved_and_freed():
    cpus = CpuPlacement("auto", slot=1)
    entered, go_on, seen = threading.Event(), threading.Event(), {}

    def connection():
        cpus.enter_thread()
        seen["entered"] = os.sched_getaffinity(0)
        entered.set()
        go_on.wait(5)
        seen["moved"] = os.sched_getaffinity(0)
        helper = threading.Thread(target=lambda: (placement.free_thread(), seen.update(helper=os.sched_getaffinity(0))))
        helper.start()
        helper.join()
        cpus.leave_thread()

    thread = threading.Thread(target=connection)
    thread.start()
    entered.wait(5)
    first = cpus.cpu
    other = next(cpu for cpu in sorted(os.sched_getaffinity(0)) if cpu != first)
    assert cpus.move_to(other)
    go_on.set()
    thread.join(5)
    assert seen["entered"] == {first}
    assert seen["moved"] == {other}
    assert seen["helper"] == os.sched_getaffinity(0)   # a thread it starts runs beside it, anywhere


def _allowed_cpus(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        listed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", f.read(), re.M).group(1)
    cpus = set()
    for part in listed.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _tasks(pid):
    return {int(tid): _allowed_cpus(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")}


def _metric(serve, name):
    request = urllib.request.Request(serve.url + "/metrics", headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


@linux_with_two_cpus
def test_serve_places_its_connection_threads_on_one_cpu_and_the_rest_nowhere(tmp_path, fake):
    serve = ServeProcess("serve", tmp_path / "data", proxy_config(fake.url))
    try:
        cpu = int(_metric(serve, "ragproxy_serving_cpu"))
        everywhere = _allowed_cpus(serve.p.pid, serve.p.pid)
        assert cpu in everywhere and len(everywhere) >= 2
        assert f"connection threads placed on CPU {cpu} of {len(everywhere)}" in serve.log()
        # A connection kept open: its thread is alive, placed, while every other thread is not.
        address = urllib.parse.urlsplit(serve.url)
        conn = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
        conn.request("GET", "/health")
        assert conn.getresponse().read()

        def tasks_with_one_placed():
            tasks = _tasks(serve.p.pid)
            return tasks if {cpu} in tasks.values() else None
        tasks = wait_for(tasks_with_one_placed, "a placed connection thread", [serve])
        placed = [tid for tid, cpus in tasks.items() if cpus == {cpu}]
        assert placed and serve.p.pid not in placed
        assert all(cpus == everywhere for tid, cpus in tasks.items() if tid not in placed)
        conn.close()
        assert _metric(serve, "ragproxy_serving_cpu_moves_total") >= 0
    finally:
        serve.stop()


@linux_with_two_cpus
def test_serve_with_cpu_pinning_off_places_nothing_and_says_so(tmp_path, fake):
    serve = ServeProcess("serve", tmp_path / "data",
                         proxy_config(fake.url, server="  client_timeout: 5\n  cpu_pinning: \"off\""))
    try:
        assert _metric(serve, "ragproxy_serving_cpu") == -1
        everywhere = _allowed_cpus(serve.p.pid, serve.p.pid)
        assert all(cpus == everywhere for cpus in _tasks(serve.p.pid).values())
        assert "connection threads not placed on a CPU: server.cpu_pinning is off" in serve.log()
    finally:
        serve.stop()
