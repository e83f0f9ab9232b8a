#!/usr/bin/env python3
"""Check that ``vendored/`` holds exactly the releases pinned in ``vendored/vendor.txt``.

    python3 tools/check_vendored.py                 # layout + versions, with this Python
    python3 tools/check_vendored.py --python /path/to/python3.9
    python3 tools/check_vendored.py --against DIR   # also compare byte for byte with the
                                                    # sdists/wheels that `pip download` put in DIR

Exit status 0 when everything matches, 1 with one line per problem otherwise.
Standard library only; runs on Python 3.9+.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENDORED = os.path.join(ROOT, "vendored")

# Distribution name (normalised) -> import name, where the two differ.
_IMPORT_NAMES = {"pyyaml": "yaml"}
# Upstream ships no __version__ for these; the pin is checked by --against only.
_NO_VERSION = {"typing_extensions"}
# Files of our own in vendored/, besides the packages and their LICENSE.<name>.
_OWN_FILES = {"vendor.txt", "README.md"}
# Compiled files would tie vendored/ to one interpreter and break the "pure
# Python, unmodified" promise.  __pycache__ directories are tolerated: Python
# writes them whenever a checkout runs, git and build_pyz.py both skip them.
_FORBIDDEN_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dylib")

_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")

# Run in a separate interpreter with -I -S so that installed copies in
# site-packages (or modules this process already imported) cannot answer for
# the vendored ones; -B keeps it from writing __pycache__ into vendored/.
_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
out = {}
for name in sys.argv[2:]:
    try:
        mod = __import__(name)
    except Exception as exc:
        out[name] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    else:
        out[name] = {"version": getattr(mod, "__version__", None),
                     "file": getattr(mod, "__file__", None)}
print(json.dumps(out))
"""


def normalise(name):
    """PEP 503 form of a distribution name, with '_' so it also matches wheel file names."""
    return re.sub(r"[-_.]+", "_", name).lower()


def import_name(dist):
    return _IMPORT_NAMES.get(normalise(dist), normalise(dist))


def read_pins(path):
    """Return [(name, version)] from a vendor.txt; raise ValueError naming the bad line."""
    pins = []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = _PIN_RE.match(line)
            if not m:
                raise ValueError("%s:%d: expected 'name==version', got %r" % (path, lineno, line))
            pins.append((m.group(1), m.group(2)))
    return pins


def _layout_problems(vendored, pins):
    problems = []
    expected = set(_OWN_FILES)
    for dist, _version in pins:
        mod = import_name(dist)
        pkg_dir = os.path.join(vendored, mod)
        if os.path.isfile(os.path.join(pkg_dir, "__init__.py")):
            expected.add(mod)
        elif os.path.isfile(pkg_dir + ".py"):
            expected.add(mod + ".py")
        else:
            problems.append("%s: neither %s/ nor %s.py in %s" % (dist, mod, mod, vendored))
        licence = "LICENSE." + dist
        expected.add(licence)
        if not os.path.isfile(os.path.join(vendored, licence)):
            problems.append("%s: %s is missing" % (dist, licence))
    for entry in sorted(os.listdir(vendored)):
        if entry not in expected and entry != "__pycache__":
            problems.append("unexpected entry vendored/%s (not pinned in vendor.txt)" % entry)
    for dirpath, dirnames, filenames in os.walk(vendored):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, vendored)
        for f in filenames:
            if f.endswith(_FORBIDDEN_SUFFIXES):
                problems.append("compiled file vendored/%s" % os.path.normpath(os.path.join(rel, f)))
    return problems


def _version_problems(vendored, pins, python):
    names = [import_name(dist) for dist, _ in pins]
    proc = subprocess.run(
        [python, "-I", "-S", "-B", "-c", _PROBE, vendored] + names,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
    )
    if proc.returncode != 0:
        return ["%s could not run the import probe: %s" % (python, proc.stderr.strip())]
    found = json.loads(proc.stdout)
    problems = []
    root = os.path.realpath(vendored) + os.sep
    for (dist, version), mod in zip(pins, names):
        info = found[mod]
        if "error" in info:
            problems.append("%s: import %s failed under %s: %s" % (dist, mod, python, info["error"]))
            continue
        if not os.path.realpath(info["file"] or "").startswith(root):
            problems.append("%s: %s was imported from %s, not vendored/" % (dist, mod, info["file"]))
        have = info["version"]
        if have is None and normalise(dist) in _NO_VERSION:
            continue
        if have != version:
            problems.append("%s: vendor.txt pins %s but %s.__version__ is %r" % (dist, version, mod, have))
    return problems


def check(vendored=VENDORED, python=None):
    """Return a list of problems (empty when vendored/ matches vendor.txt).

    Checks that every pin has its package and LICENSE file, that nothing else
    (and nothing compiled) is in the directory, and that each package imports
    from vendored/ under *python* (default: this interpreter) and reports the
    pinned ``__version__``.
    """
    pins = read_pins(os.path.join(vendored, "vendor.txt"))
    problems = _layout_problems(vendored, pins)
    if not problems:
        problems = _version_problems(vendored, pins, python or sys.executable)
    return problems


# --- comparison with upstream archives ---------------------------------------

def _find_archive(archive_dir, dist, version):
    want = (normalise(dist), version)
    for entry in sorted(os.listdir(archive_dir)):
        if entry.endswith(".whl"):
            parts = entry[:-4].split("-")
        elif entry.endswith(".tar.gz"):
            parts = entry[:-7].rsplit("-", 1)
        else:
            continue
        if len(parts) >= 2 and (normalise(parts[0]), parts[1]) == want:
            return os.path.join(archive_dir, entry)
    return None


def _archive_members(path, mod):
    """Return ({name under the import root: bytes} for *mod*, [licence texts])."""
    entries, licences = {}, []
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                if name.endswith("/"):
                    continue
                if name.split("/", 1)[0].endswith(".dist-info"):
                    if os.path.basename(name).startswith(("LICENSE", "LICENCE", "COPYING")):
                        licences.append(zf.read(name))
                else:
                    entries[name] = zf.read(name)
        roots = ("",)
    else:
        with tarfile.open(path) as tf:
            for member in tf.getmembers():
                if not member.isfile():
                    continue
                rest = member.name.partition("/")[2]
                data = tf.extractfile(member).read()
                if "/" not in rest and rest.startswith(("LICENSE", "LICENCE", "COPYING")):
                    licences.append(data)
                entries[rest] = data
        # An sdist may keep the pure-Python package under lib/ or src/ while a
        # same-named top-level directory holds C sources (PyYAML does this), so
        # take the first root that has the package, and only that one.
        roots = ("lib/", "src/", "")
    for root in roots:
        files = {}
        for name, data in entries.items():
            if not name.startswith(root):
                continue
            rel = name[len(root):]
            if (rel == mod + ".py" or rel.startswith(mod + "/")) and "__pycache__" not in rel.split("/"):
                files[rel] = data
        if files:
            return files, licences
    return {}, licences


def _vendored_files(vendored, mod):
    single = os.path.join(vendored, mod + ".py")
    if os.path.isfile(single):
        return {mod + ".py": single}
    out = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(vendored, mod)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            full = os.path.join(dirpath, f)
            out[os.path.relpath(full, vendored).replace(os.sep, "/")] = full
    return out


def compare_upstream(archive_dir, vendored=VENDORED):
    """Return problems found comparing vendored/ with the pinned sdists/wheels in *archive_dir*."""
    problems = []
    for dist, version in read_pins(os.path.join(vendored, "vendor.txt")):
        archive = _find_archive(archive_dir, dist, version)
        if archive is None:
            problems.append("%s==%s: no wheel or sdist for it in %s" % (dist, version, archive_dir))
            continue
        mod = import_name(dist)
        want, licences = _archive_members(archive, mod)
        have = _vendored_files(vendored, mod)
        for name in sorted(set(want) - set(have)):
            problems.append("%s: vendored/%s is missing" % (dist, name))
        for name in sorted(set(have) - set(want)):
            problems.append("%s: vendored/%s is not in %s" % (dist, name, os.path.basename(archive)))
        for name in sorted(set(want) & set(have)):
            with open(have[name], "rb") as fh:
                if fh.read() != want[name]:
                    problems.append("%s: vendored/%s differs from upstream" % (dist, name))
        licence = os.path.join(vendored, "LICENSE." + dist)
        if os.path.isfile(licence):
            with open(licence, "rb") as fh:
                if fh.read() not in licences:
                    problems.append("%s: LICENSE.%s matches no licence file in %s"
                                    % (dist, dist, os.path.basename(archive)))
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vendored", default=VENDORED, help="directory to check (default: %(default)s)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that must import the packages (default: this one)")
    parser.add_argument("--against", metavar="DIR",
                        help="also compare with the pinned sdists/wheels downloaded into DIR")
    args = parser.parse_args(argv)
    try:
        problems = check(args.vendored, args.python)
        if args.against:
            problems += compare_upstream(args.against, args.vendored)
    except (OSError, ValueError) as exc:
        print("check_vendored: %s" % exc, file=sys.stderr)
        return 1
    for problem in problems:
        print(problem)
    if problems:
        return 1
    pins = read_pins(os.path.join(args.vendored, "vendor.txt"))
    print("vendored/ matches vendor.txt: %s" % ", ".join("%s==%s" % p for p in pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
