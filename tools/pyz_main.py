"""Start ragproxy from its .pyz: the archive's ``__main__.py`` (tools/build_pyz.py writes it from this file).

zipimport never caches bytecode, so code imported from the archive would be
compiled again on every start.  Instead the archive's files are extracted,
once per build, into ``CACHE/pyz-VERSION-BUILD/``, ragproxy's own modules
are compiled there for the running Python (whatever PYTHONDONTWRITEBYTECODE
says: the directory is ours), and everything is imported from there.  CACHE is
``RAGPROXY_CACHE_DIR``, else ``$XDG_CACHE_HOME/ragproxy``, else
``~/.cache/ragproxy``.  The files go to a temporary directory that is then
renamed into place, so neither a crash nor a second process starting at the
same moment ever sees half a copy.  A copy that lost files (a cache cleaner)
is replaced on the next start.

With no usable cache directory (no home, a read-only one, one that another
user could write to) ragproxy runs from the archive itself: the same code,
compiled on every start.  ``--version`` says where the code was loaded from.

Standard library only; Python 3.9+.  The usual start (the copy exists) imports
nothing beyond what Python has already loaded.
"""
import os
import stat
import sys

#: Filled in by tools/build_pyz.py: the package version, a digest of every other member, and the
#: files an extracted copy must hold (the code; the vendored packages degrade gracefully if missing).
VERSION = "0"
BUILD = "unbuilt"
PACKAGE_FILES = ()


def cache_root(environ):
    """Where extracted builds live, or None when there is no such place."""
    root = environ.get("RAGPROXY_CACHE_DIR")
    if not root:
        base = environ.get("XDG_CACHE_HOME")
        if not base or not os.path.isabs(base):   # the XDG spec: a relative value is ignored
            home = os.path.expanduser("~")
            # No home: "~" stays as it is, an empty HOME gives "/", a deleted one does not exist.
            if home == os.sep or not os.path.isabs(home) or not os.path.isdir(home):
                return None
            base = os.path.join(home, ".cache")
        root = os.path.join(base, "ragproxy")
    return root if os.path.isabs(root) else None


def _private_dir(path):
    """Create ``path`` (mode 0700) if needed; True when no other user can write to it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return mine and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _complete(copy):
    return all(os.path.isfile(os.path.join(copy, name)) for name in PACKAGE_FILES)


def _compiled(copy):
    """Whether the running Python's bytecode of the package is in ``copy``."""
    from importlib.util import cache_from_source
    return os.path.isfile(cache_from_source(os.path.join(copy, "ragproxy.py")))


def _compile(copy, shown_as):
    """Compile the package's modules in ``copy`` where imports look for them (PYTHONPYCACHEPREFIX
    included), naming them as if they lived in ``shown_as`` (for tracebacks)."""
    import py_compile
    from importlib.util import cache_from_source

    for name in PACKAGE_FILES:
        if name.endswith(".py"):
            final = os.path.join(shown_as, name)
            cached = cache_from_source(final)
            if cached.startswith(shown_as + os.sep):   # __pycache__ beside the source: inside the copy
                cached = os.path.join(copy, os.path.relpath(cached, shown_as))
            py_compile.compile(os.path.join(copy, name), cached, final, doraise=True)


def _extract(archive, root, target):
    import shutil
    import tempfile
    import zipfile

    staging = tempfile.mkdtemp(prefix=".extract-", dir=root)
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(staging, [name for name in zf.namelist() if name != "__main__.py"])
        _compile(staging, target)
        if os.path.isdir(target) and not _complete(target):
            # Moved aside in one step, so that a process starting beside us
            # never imports from a copy half deleted.
            aside = tempfile.mkdtemp(prefix=".pruned-", dir=root)
            os.rename(target, os.path.join(aside, "copy"))
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            if not _complete(target):   # else another process's copy landed first: use it
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def extracted(archive, environ):
    """This build's extracted copy, made on first use; None to run from the archive."""
    root = cache_root(environ)
    if root is None:
        return None
    target = os.path.join(root, "pyz-%s-%s" % (VERSION, BUILD))
    try:
        if not _private_dir(root):
            return None
        if not _complete(target):
            _extract(archive, root, target)
        elif not _compiled(target):   # extracted by another Python version
            _compile(target, target)
    except Exception:   # OSError, a damaged archive: the archive itself can still run
        return None
    return target


def main():
    archive = os.path.dirname(os.path.abspath(__file__))
    target = extracted(archive, os.environ)
    if target is not None:
        # sys.path[0] is the archive, as the command line named it.
        if sys.path and os.path.abspath(sys.path[0]) == archive:
            sys.path[0] = target
        else:
            sys.path.insert(0, target)
    import ragproxy
    return ragproxy.main()


if __name__ == "__main__":
    sys.exit(main())
