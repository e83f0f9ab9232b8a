"""Which files of a knowledge base's sources are indexed: .gitignore rules and globs.

GitIgnore holds the .gitignore rules in force for one directory, inherited
downwards as the walk descends; glob_match applies the same rules to
``include`` and ``exclude`` (a pattern without an inner slash matches at any
depth, as in .gitignore); ALWAYS_EXCLUDED_DIRS are the
tool and VCS folders no knowledge base wants.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import functools
import os
import re

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
