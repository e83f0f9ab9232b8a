"""Which files of a knowledge base's sources are indexed: the walk, .gitignore rules and globs.

source_roots names a knowledge base's roots (its documents folder and each
configured source) and the label its files are cited under; scan_roots walks
them, with stats only, into the files to index and each root's state (ok,
missing, unreadable, empty), which the KB reports.  GitIgnore holds the
.gitignore rules in force for one directory, inherited downwards as the walk
descends; glob_match applies the same rules to ``include`` and ``exclude`` (a
pattern without an inner slash matches at any depth, as in .gitignore);
ALWAYS_EXCLUDED_DIRS are the tool and VCS folders no knowledge base wants.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import functools
import glob
import itertools
import os
import re
import stat

ALWAYS_EXCLUDED_DIRS = frozenset((".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv",
                                   ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".idea", ".DS_Store"))


# -- .gitignore -------------------------------------------------------------

def _gitignore_regex(pattern):
    """A compiled regex for one .gitignore pattern, matched against a path relative to its directory."""
    anchored = pattern.startswith("/") or "/" in pattern.rstrip("/")
    pattern = pattern.strip("/")
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:j].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    prefix = "" if anchored else "(?:.*/)?"
    return re.compile("^" + prefix + "".join(out) + "(?:/.*)?$")


class GitIgnore:
    """The .gitignore rules in force for one directory, inherited downwards."""

    def __init__(self, rules=()):
        self.rules = list(rules)  # (base_rel, regex, negate, dir_only)

    def child(self, dir_abs, dir_rel):
        path = os.path.join(dir_abs, ".gitignore")
        if not os.path.isfile(path):
            return self
        rules = list(self.rules)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return self
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            dir_only = line.endswith("/")
            rules.append((dir_rel, _gitignore_regex(line.rstrip("/") if dir_only else line), negate, dir_only))
        return GitIgnore(rules)

    def ignored(self, rel, is_dir):
        result = False
        for base, regex, negate, dir_only in self.rules:
            if base:
                if not rel.startswith(base + "/"):
                    continue
                sub = rel[len(base) + 1:]
            else:
                sub = rel
            if dir_only and not is_dir:
                # "build/" ignores files below a build directory, not a file named build
                if not any(regex.match("/".join(sub.split("/")[:n])) for n in range(1, sub.count("/") + 1)):
                    continue
            if regex.match(sub):
                result = not negate
        return result


def glob_match(rel, patterns, is_dir=None):
    """Whether ``include``/``exclude`` ``patterns`` select the path ``rel`` (relative to its source).

    The patterns follow .gitignore rules: one without a slash but at its end
    matches at any depth (``tests/``, ``*.pyi``), a leading or inner slash
    anchors it to the source root (``/build``, ``docs/*.md``), ``**`` spans
    folders, a trailing slash matches folders (and so what is below them)
    only, and a later ``!pattern`` takes a match back.  The last pattern
    that matches decides.  ``rel`` ending in ``/`` (or ``is_dir``) is a folder.
    """
    if is_dir is None:
        is_dir = rel.endswith("/")
    rel = rel.rstrip("/")
    if not patterns or not rel:
        return False
    return _compiled(tuple(patterns)).ignored(rel, is_dir)


@functools.lru_cache(maxsize=64)
def _compiled(patterns):
    rules = []
    for pattern in patterns:
        negate = pattern.startswith("!")
        if negate:
            pattern = pattern[1:]
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/") if dir_only else pattern
        if pattern.strip("/"):
            rules.append(("", _gitignore_regex(pattern), negate, dir_only))
    return GitIgnore(rules)


# -- the walk ----------------------------------------------------------------

def source_roots(name, data_dir, documents_dir, sources):
    """The documents folder and each configured source: ``{source, path, label, kind}``.

    A source's label is its folder's name (``/src/numpy`` -> ``numpy``), made
    unique against earlier sources with ``_``.  The documents folder is
    labelled with the KB's name, but yields it to a source of that name
    (``documents`` instead): a KB ``numpy`` over ``/src/numpy`` cites
    ``numpy/linalg/_linalg.py``, never ``numpy_/...``.

    Relative paths are relative to ``data_dir``.
    """
    roots, labels = [], set()
    for source in sources:
        path = os.path.normpath(os.path.join(data_dir, os.path.expanduser(source)))
        label = os.path.basename(path.rstrip(os.sep)) or "root"
        while label in labels:
            label += "_"
        labels.add(label)
        roots.append({"source": source, "path": path, "label": label, "kind": "source"})
    label = name
    if label in labels:
        label = "documents"
        while label in labels:
            label += "_"
    documents = {"source": f"documents/{name}/", "path": documents_dir, "label": label, "kind": "documents"}
    return [documents] + roots


def scan_roots(roots, include=(), exclude=(), gitignore=True, skip=()):
    """Every indexable file of ``roots`` (source_roots), and the state of each root.

    Returns ``(found, states)``: ``found`` maps a source id (``label/path``)
    to ``(path, size, mtime_ns)``; ``states`` is one dict per root, the root's
    own keys plus ``state`` ("ok", "missing", "unreadable" or "empty"),
    ``files`` and ``message``.  ``skip`` names files at the top of the
    documents folder that are ragproxy's own (the upload manifest).  A walk
    with stats only: no file is read.
    """
    found, states = {}, []
    for root in roots:
        before = len(found)
        state, message = _scan_root(root, found, include, exclude, gitignore, skip)
        states.append(dict(root, state=state, files=len(found) - before, message=message))
    return found, states


def _scan_root(root, found, include, exclude, gitignore, skip):
    """Add the files of one root to ``found``; returns its ``(state, message)``."""
    label, path, source = root["label"], root["path"], root["source"]
    documents = root["kind"] == "documents"
    named = f"source {source!r}" + (f" ({path})" if path != source else "")
    if any(c in path for c in "*?["):
        matched = [p for p in sorted(glob.glob(path, recursive=True)) if os.path.isfile(p)]
        for match in matched:
            _add_file(found, label + "/" + os.path.basename(match), match)
        if matched:
            return "ok", None
        parts = path.split(os.sep)
        base = os.sep.join(itertools.takewhile(lambda part: not any(c in part for c in "*?["), parts))
        if not os.path.isdir(base or os.sep):
            return "missing", f"source {source!r} matches no file: {base} does not exist"
        return "empty", f"source {source!r} matches no file"
    if not os.path.exists(path):
        if documents:
            return "empty", f"no documents yet: drop files in {path}{os.sep} or upload them"
        return "missing", f"{named} does not exist"
    if os.path.isfile(path):
        if not os.access(path, os.R_OK):
            return "unreadable", f"{named} cannot be read: permission denied"
        _add_file(found, label, path)
        return "ok", None
    if not os.path.isdir(path):
        return "unreadable", f"{named} is neither a file nor a folder"
    try:
        os.listdir(path)
    except OSError as exc:
        return "unreadable", f"{named} cannot be read: {exc.strerror or exc}"
    failed = []  # folders below the root that could not be listed
    before = len(found)
    ignores = {path: GitIgnore()}
    for dirpath, dirnames, filenames in os.walk(path, onerror=failed.append):
        rel_dir = os.path.relpath(dirpath, path).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir
        rules = ignores.pop(dirpath, GitIgnore())
        if gitignore:
            rules = rules.child(dirpath, rel_dir)
        keep = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if d in ALWAYS_EXCLUDED_DIRS or (gitignore and rules.ignored(rel, True)) \
                    or glob_match(rel + "/", exclude) or os.path.islink(os.path.join(dirpath, d)):
                continue
            keep.append(d)
            ignores[os.path.join(dirpath, d)] = rules
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if name == ".gitignore" or (gitignore and rules.ignored(rel, False)):
                continue
            if rel in skip and documents:
                continue
            if include and not glob_match(rel, include):
                continue
            if glob_match(rel, exclude):
                continue
            _add_file(found, f"{label}/{rel}", os.path.join(dirpath, name))
    where = "" if not failed else "; %d folder%s below it could not be read (%s: %s)" % (
        len(failed), "s" if len(failed) > 1 else "", failed[0].filename, failed[0].strerror or failed[0])
    if len(found) > before:
        return "ok", (named + ":" + where[1:]) if where else None
    if documents:
        return "empty", f"no documents yet: drop files in {path}{os.sep} or upload them" + where
    return "empty", f"{named} holds no file that include/exclude let through" + where

def _add_file(found, source_id, path):
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):  # not a FIFO or device: reading one would block the indexer or never end
        found[source_id] = (path, st.st_size, st.st_mtime_ns)
