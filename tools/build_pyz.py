#!/usr/bin/env python3
"""Build dist/ragproxy.pyz, a single-file zipapp of ragproxy and its vendored packages.

    python3 tools/build_pyz.py [--out PATH]

The archive holds ragproxy.py, vendored/** and static/** (when present) and a
__main__.py that runs ragproxy.main().  It is reproducible: the same sources
give the same bytes, whoever builds them and when.  Entry timestamps come from
SOURCE_DATE_EPOCH (default 315532800, 1980-01-01, the earliest a zip can say).
Standard library only; runs on Python 3.9+.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z
SHEBANG = b"#!/usr/bin/env python3\n"
MAIN_PY = b"import sys, ragproxy\nsys.exit(ragproxy.main())\n"
# Trees packed recursively, if they exist; ragproxy.py is required.
TREES = ("vendored", "static")
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
        raise BuildError("%s not found (build it with parts/assemble.py first?)" % main_file)
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
    entries.append(("__main__.py", MAIN_PY))
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


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "dist", "ragproxy.pyz"),
                        help="where to write the archive (default: %(default)s)")
    parser.add_argument("--root", default=ROOT,
                        help="directory holding ragproxy.py, vendored/, static/ (default: %(default)s)")
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
