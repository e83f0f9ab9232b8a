#!/usr/bin/env python3
"""Build dist/ragproxy.pyz, a single-file zipapp of ragproxy and its vendored packages.

    python3 tools/build_pyz.py [--out PATH] [--root CHECKOUT]

The archive holds ragproxy.py, the _ragproxy package, vendored/** and
static/** (when present), and a __main__.py made from tools/pyz_main.py: it
extracts the archive once per build into a cache directory and runs
ragproxy.main() from there, so the code is compiled once, not on every start.
The archive is reproducible: the same sources give the same bytes, whoever
builds them and when.  Entry timestamps come from SOURCE_DATE_EPOCH (default
315532800, 1980-01-01, the earliest a zip can say).  Standard library only;
runs on Python 3.9+.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z
SHEBANG = b"#!/usr/bin/env python3\n"
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyz_main.py")
PACKAGE = "_ragproxy"
# Trees packed recursively, if they exist; ragproxy.py and the package are required.
TREES = (PACKAGE, "vendored", "static")
# What an extracted copy must hold to be run (the bootstrap's PACKAGE_FILES).
_CODE_TREES = ("ragproxy.py", PACKAGE + "/", "static/")
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_FILE_MODE = 0o100644  # regular file, rw-r--r--, the same on every build machine
_ZIP_MIN, _ZIP_MAX = 315532800, 4354819198  # what a DOS date can hold (1980..2107)


class BuildError(Exception):
    pass


def epoch_from_env(environ=None):
    """The build timestamp: SOURCE_DATE_EPOCH if set, else DEFAULT_EPOCH, clamped to the zip range."""
    raw = (os.environ if environ is None else environ).get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return DEFAULT_EPOCH
    try:
        value = int(raw)
    except ValueError:
        raise BuildError("SOURCE_DATE_EPOCH must be an integer, got %r" % raw) from None
    # Dates outside what a zip entry can store would make zipfile raise; clamp
    # instead, as other reproducible-build tools do.
    return min(max(value, _ZIP_MIN), _ZIP_MAX)


def collect(root):
    """Return sorted [(archive name, absolute path)] of the files to pack from *root*."""
    main_file = os.path.join(root, "ragproxy.py")
    if not os.path.isfile(main_file):
        raise BuildError("%s not found: --root must be a ragproxy checkout" % main_file)
    members = [("ragproxy.py", main_file)]
    for tree in TREES:
        top = os.path.join(root, tree)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            for name in filenames:
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                full = os.path.join(dirpath, name)
                if not os.path.isfile(full):  # dangling links, sockets: nothing to pack
                    continue
                arcname = os.path.relpath(full, root).replace(os.sep, "/")
                members.append((arcname, full))
    return sorted(members)


def _entry(arcname, date_time):
    info = zipfile.ZipInfo(arcname, date_time=date_time)
    info.create_system = 3  # "Unix", so external_attr means the same everywhere
    info.external_attr = _FILE_MODE << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def build(out, root=ROOT, epoch=None):
    """Write the zipapp to *out*; return (path, size, sha256 hex)."""
    epoch = DEFAULT_EPOCH if epoch is None else epoch
    date_time = time.gmtime(epoch)[:6]
    members = collect(root)
    entries = [(name, _read(path)) for name, path in members]
    entries.append(("__main__.py", bootstrap(entries, package_version(root))))
    entries.sort()

    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # Write beside the target and rename, so a failed build never leaves a
    # truncated .pyz where a working one was.
    fd, tmp = tempfile.mkstemp(prefix=".ragproxy-", suffix=".pyz.tmp", dir=os.path.dirname(out))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(SHEBANG)
            with zipfile.ZipFile(fh, "w") as zf:
                for name, data in entries:
                    zf.writestr(_entry(name, date_time), data, compresslevel=9)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    with open(out, "rb") as fh:
        blob = fh.read()
    return out, len(blob), hashlib.sha256(blob).hexdigest()


def package_version(root):
    """``__version__`` of the checkout's package, read without importing it."""
    init = os.path.join(root, PACKAGE, "__init__.py")
    try:
        found = re.search(r'^__version__ = "([^"]+)"$', _read(init).decode("utf-8"), re.M)
    except OSError:
        raise BuildError("%s not found: --root must be a ragproxy checkout" % init) from None
    if found is None:
        raise BuildError("%s does not set __version__" % init)
    return found.group(1)


def bootstrap(entries, version):
    """tools/pyz_main.py with this build's version, digest and package files filled in."""
    digest = hashlib.sha256()
    for name, data in sorted(entries):
        digest.update(b"%d:%s\0%d:" % (len(name), name.encode("utf-8"), len(data)))
        digest.update(data)
    code = tuple(name for name, _ in sorted(entries) if name.startswith(_CODE_TREES))
    source = _read(BOOTSTRAP).decode("utf-8")
    for placeholder, value in (('VERSION = "0"', "VERSION = %r" % version),
                               ('BUILD = "unbuilt"', "BUILD = %r" % digest.hexdigest()[:16]),
                               ("PACKAGE_FILES = ()", "PACKAGE_FILES = %r" % (code,))):
        if source.count("\n" + placeholder + "\n") != 1:
            raise BuildError("%s: expected one line %r" % (BOOTSTRAP, placeholder))
        source = source.replace("\n" + placeholder + "\n", "\n" + value + "\n")
    return source.encode("utf-8")


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "dist", "ragproxy.pyz"),
                        help="where to write the archive (default: %(default)s)")
    parser.add_argument("--root", default=ROOT,
                        help="checkout holding ragproxy.py, _ragproxy/, vendored/, static/ (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        path, size, digest = build(args.out, args.root, epoch_from_env())
    except (BuildError, OSError) as exc:
        print("build_pyz: error: %s" % exc, file=sys.stderr)
        return 1
    print("%s  %d bytes  sha256 %s" % (path, size, digest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
