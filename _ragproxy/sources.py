"""Which files of a knowledge base's sources are indexed: .gitignore rules and globs.

GitIgnore holds the .gitignore rules in force for one directory, inherited
downwards as the walk descends; glob_match is fnmatch with ``**`` spanning
directories, for ``include`` and ``exclude``; ALWAYS_EXCLUDED_DIRS are the
tool and VCS folders no knowledge base wants.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import fnmatch
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


def glob_match(rel, patterns):
    """fnmatch with ``**`` spanning directories; a pattern without ``/`` matches the file name too."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        if "/" not in pattern and fnmatch.fnmatchcase(name, pattern):
            return True
        if fnmatch.fnmatchcase(rel, pattern) or ("**/" in pattern and fnmatch.fnmatchcase(
                rel, pattern.replace("**/", ""))):
            return True
    return False
