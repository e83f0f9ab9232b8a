"""How the worker processes of one server share their metrics, so that /metrics and the panel count them all.

``serve --workers N`` forks N workers, each with its own metrics.Metrics,
serving one socket; a scrape reaches any one of them.  Each worker's
MetricsShare, set as its registry's ``share``, writes the registry's
``export_state()`` to ``<directory>/worker-<slot>.json`` (replaced whole,
mode 0600), and the registry's ``render()`` and ``compression_counts()`` add
the other slots' files to its live values (never the file of its own slot:
the live values are newer).  So every worker answers the sum, at most about
one flush interval behind for the others' latest counts.  This module knows
the registry only by those methods (metrics imports it, not the reverse).

What collectors report (the knowledge bases' chunks and bytes read from
disk, the vector store's state, the interpreter's garbage collector, the
request log's drops) is not in the files: it comes from the answering
process only.

A worker started into a slot first adds that slot's file, its
predecessor's last flush, to its registry (counters and histograms; not
gauges, which described the process that is gone), so the sums do not go
backwards when a worker dies and is replaced.  Hence the directory belongs
to one run of the server: the supervisor empties it (``MetricsShare.clear``)
before it forks the first workers, as files left by an earlier run would be
counted again, and starts a slot's new worker only once the old one has
exited (the old one's last flush would overwrite the new one's file).

A peer's file that cannot be read or does not fit (corrupt, from another
release) is left out of the sums, with one warning until it reads again.

May import: files.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading

from .files import atomic_write, temp_name_of

log = logging.getLogger("ragproxy")

_SLOT_FILE = re.compile(r"worker-(0|[1-9][0-9]*)\.json\Z")


def slot_file(directory, slot):
    """The file worker ``slot`` writes its metrics to in ``directory``."""
    return os.path.join(directory, f"worker-{int(slot)}.json")


def _is_slot_temp_file(name):
    # atomic_write's temporary file for a slot's file: a worker killed between its write and its rename
    target = name[1:].split(".json.", 1)[0] + ".json"
    return bool(_SLOT_FILE.match(target)) and name.startswith(temp_name_of(target)) and name.endswith(".tmp")


class MetricsShare:
    """Worker ``slot``'s side of the metrics shared in ``directory``.

    ``metrics.share = MetricsShare(directory, slot)`` attaches it (see
    ``attach``).  ``flush()`` writes the registry's state now; ``run(stop_event)``
    (a thread's target) writes it every ``interval`` seconds while something
    changed, and once more when ``stop_event`` is set.
    """

    def __init__(self, directory, slot):
        if int(slot) < 0:
            raise ValueError(f"a worker's slot is 0 or more, not {slot}")
        self.directory, self.slot = directory, int(slot)
        self.path = slot_file(directory, slot)
        self.metrics = None
        self._flush_lock = threading.Lock()
        self._flushed = None   # metrics.changes() when last written
        self._warned = set()
        self._warned_lock = threading.Lock()

    @staticmethod
    def clear(directory):
        """Remove every slot's file (and any half-written one) from ``directory``: the supervisor's,
        before it forks the first workers of a run."""
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if _SLOT_FILE.match(name) or _is_slot_temp_file(name):
                try:
                    os.unlink(os.path.join(directory, name))
                except FileNotFoundError:
                    pass

    def attach(self, metrics):
        """Serve ``metrics`` (a metrics.Metrics; its ``share`` setter calls this): make the directory,
        then add the slot's existing file, a predecessor's, to the registry's counters and histograms."""
        if self.metrics is metrics:
            return
        if self.metrics is not None:
            raise ValueError("a MetricsShare serves one registry")
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self.metrics = metrics
        self._inherit()

    def _attached(self):
        if self.metrics is None:
            raise RuntimeError("this MetricsShare is no registry's share yet (set metrics.share to it)")
        return self.metrics

    def _inherit(self):
        try:
            with open(self.path, "rb") as f:
                parsed = self.metrics.parse_state(json.loads(f.read()))
        except FileNotFoundError:
            return
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("metrics: worker %d starts from 0, its predecessor's %s is unreadable: %s",
                        self.slot, self.path, exc)
            return
        self.metrics.add_state(parsed)

    def _warn_once(self, what, message, *args):
        with self._warned_lock:
            if what in self._warned:
                return
            self._warned.add(what)
        log.warning(message, *args)

    def _read_again(self, what):
        with self._warned_lock:
            self._warned.discard(what)

    def flush(self):
        """Write the registry's state to this slot's file now; False (and one warning) if that failed."""
        self._attached()
        with self._flush_lock:
            changes = self.metrics.changes()   # before the export: a change during it is written next time
            data = json.dumps(self.metrics.export_state(), separators=(",", ":")).encode("utf-8")
            try:
                # No fsync: the files matter to the processes of this run, not after a power cut.
                atomic_write(self.path, data, mode=0o600, fsync=False)
            except OSError as exc:
                self._warn_once(self.path, "metrics: cannot write %s, the other workers miss this one's "
                                "counts: %s", self.path, exc)
                return False
            self._read_again(self.path)
            self._flushed = changes
            return True

    def run(self, stop_event, interval=1.0):
        """Flush at most every ``interval`` seconds while something changed, until ``stop_event`` is set."""
        self._attached()
        while not stop_event.wait(interval):
            if self.metrics.changes() != self._flushed:
                self.flush()
        if self.metrics.changes() != self._flushed:
            self.flush()

    def peers(self):
        """The other slots' files, each as ``metrics.parse_state()`` reads it, in slot order."""
        self._attached()
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            self._warn_once(self.directory, "metrics: cannot list %s, the other workers' counts are left out: %s",
                            self.directory, exc)
            return []
        self._read_again(self.directory)
        slots = sorted((int(m.group(1)), m.group(0)) for m in map(_SLOT_FILE.match, names) if m)
        out = []
        for slot, name in slots:
            if slot == self.slot:
                continue
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    out.append(self.metrics.parse_state(json.loads(f.read())))
            except FileNotFoundError:   # gone since the listing
                continue
            except (OSError, ValueError, RecursionError) as exc:
                self._warn_once(path, "metrics: worker %d's counts are left out, %s is unreadable: %s",
                                slot, path, exc)
                continue
            self._read_again(path)
        return out
