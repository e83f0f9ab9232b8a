"""Documents become retrieval-sized Chunks: chunk_document.

By headings for prose, by symbols for code (Python through ast, other
languages by bracket depth and indentation; small neighbouring definitions
share a chunk, named "a, b, c"), by paragraphs or by a token window; "auto"
picks by Document.kind.  Sizes are in estimated tokens
(documents.count_tokens); the defaults and why are in ``defaults``.  Overlap
lets a sentence cut at a chunk edge be found from either side, so only the
token strategy (and sections too big for one chunk) overlap; code, paragraph
and section chunks end at structural boundaries.

Line numbers are 1-based and inclusive, in Document.text (the file's lines
for text formats).  Code and section chunks hold exactly those lines
(sections without trailing spaces); token chunks may begin or end inside a
long line (sentence cuts) and keep one blank line where there were several.
A single code line longer than the chunk is cut between words, each piece
citing that line.  What retrieval should see besides the text (title and
heading path, or path and symbol) is Chunk.context: index
Chunk.index_text().  Chunk.hash covers that index text, so a renamed heading
or a moved file re-embeds just the chunks it affects.

May import: defaults, documents.
"""
from __future__ import annotations

import ast
import bisect
import collections
import hashlib
import re
import warnings

from .defaults import DEFAULT_CHUNK_SIZE
from .documents import WORD_RE, Chunk, count_tokens, markdown_headings, rst_headings

#: Bump when the chunks of some document change (boundaries, symbols, text):
#: knowledge bases built before then must be re-chunked.
CHUNKING_VERSION = 2

# --------------------------------------------------------------------------
# Packing: the one cutting rule shared by every strategy

def _pack(tokens, scores, size, overlap):
    """Group units 0..n-1 into [start, end) spans of at most ``size`` tokens
    (a single bigger unit stands alone).  Where a span must end, it ends before
    the best-scored unit among those that keep it at least half full (the
    latest such on ties); the next span starts up to ``overlap`` tokens back."""
    n = len(tokens)
    prefix = [0]
    for t in tokens:
        prefix.append(prefix[-1] + t)
    spans = []
    i = 0
    while i < n:
        j = i + 1
        while j < n and prefix[j + 1] - prefix[i] <= size:
            j += 1
        if j < n:
            best, best_score = j, scores[j]
            floor = prefix[i] + size / 2
            k = j - 1
            while k > i and prefix[k] >= floor:
                if scores[k] > best_score:
                    best, best_score = k, scores[k]
                k -= 1
            j = best
        spans.append((i, j))
        if j >= n:
            break
        nxt = j
        if overlap > 0:
            budget = min(overlap, size - tokens[j])
            while nxt - 1 > i and prefix[j] - prefix[nxt - 1] <= budget:
                nxt -= 1
        i = nxt
    return spans


# --------------------------------------------------------------------------
# Token strategy

_SENTENCE_END_RE = re.compile(r"[.!?][\"')\]\u201d\u2019]*\s+|[\u3002\uff01\uff1f]\s*")
_HEADING_LINE_RE = re.compile(r"^ {0,3}#{1,6}\s")


def _split_sentences(line):
    cuts = [m.end() for m in _SENTENCE_END_RE.finditer(line)]
    out, prev = [], 0
    for c in cuts + [len(line)]:
        if c > prev:
            out.append(line[prev:c])
            prev = c
    return out


def _hard_split(text, size):
    """Pieces of about ``size`` tokens, cut between whitespace-separated words,
    or between characters for text without spaces (CJK)."""
    words = list(re.finditer(r"\S+", text))
    if len(words) > 1:
        pieces, start, acc = [], 0, 0
        for m in words:
            t = count_tokens(m.group())
            if acc and acc + t > size:
                pieces.append(text[start:m.start()])
                start, acc = m.start(), 0
            acc += t
        pieces.append(text[start:])
        return pieces
    step = max(1, size - 1)     # one estimated token per CJK character, plus one
    return [text[k:k + step] for k in range(0, len(text), step)]


def _token_pieces(lines, lo, hi, size, overlap):
    """[(text, line_start, line_end)] for lines[lo:hi] (1-based line numbers)."""
    texts, where, tokens, scores = [], [], [], []

    def add(text, line, n, score):
        texts.append(text)
        where.append(line)
        tokens.append(n)
        scores.append(score)

    paragraph = True
    split_above = max(1, size // 4)
    for i in range(lo, hi):
        line = lines[i]
        if not line.strip():
            paragraph = True
            continue
        first = 4 if _HEADING_LINE_RE.match(line) else (3 if paragraph else 2)
        paragraph = False
        n = count_tokens(line)
        if n <= split_above:
            add(line, i, n, first)
            continue
        for k, sentence in enumerate(_split_sentences(line)):
            sn = count_tokens(sentence)
            if sn == 0 and texts and where[-1] == i:
                texts[-1] += sentence       # trailing whitespace stays with its sentence
                continue
            parts = [sentence] if sn <= size else _hard_split(sentence, split_above)
            for m, part in enumerate(parts):
                add(part, i, count_tokens(part), first if k == 0 and m == 0 else (1 if m == 0 else 0))
    out = []
    for a, b in _pack(tokens, scores, size, overlap):
        rows, prev = [], None
        for u in range(a, b):
            if where[u] == prev:
                rows[-1] += texts[u]
            else:
                if prev is not None and where[u] > prev + 1:
                    rows.append("")
                rows.append(texts[u])
                prev = where[u]
        text = "\n".join(r.rstrip() for r in rows).strip("\n")
        if a > 0 and where[a - 1] == where[a]:
            text = text.lstrip()
        if text.strip():
            out.append((text, where[a] + 1, where[b - 1] + 1))
    return out


def _paragraph_pieces(lines, size):
    blocks, start = [], None
    for i, line in enumerate(lines + [""]):
        if line.strip():
            if start is None:
                start = i
        elif start is not None:
            blocks.append((start, i))
            start = None
    units = []      # (text, line_start, line_end, tokens)
    for a, b in blocks:
        n = sum(count_tokens(lines[i]) for i in range(a, b))
        if n <= size:
            units.append(("\n".join(lines[a:b]).rstrip(), a + 1, b, n))
        else:
            units.extend((t, s, e, count_tokens(t)) for t, s, e in _token_pieces(lines, a, b, size, 0))
    out = []
    for a, b in _pack([u[3] for u in units], [1] * len(units), size, 0):
        group = units[a:b]
        out.append((_join_pieces([(u[0], u[1], u[2]) for u in group]), group[0][1], group[-1][2]))
    return out


def _join_pieces(pieces):
    text, prev_end = "", None
    for piece, start, end in pieces:
        if prev_end is not None:
            text += "\n\n" if start > prev_end + 1 else "\n"
        text += piece
        prev_end = end
    return text


# --------------------------------------------------------------------------
# Heading strategy

def _heading_pieces(doc, lines, size, overlap):
    """[(text, line_start, line_end, headings)]: one chunk per section, tiny
    sections merged into the following ones under their common parent, big
    sections split with the token strategy."""
    heads = rst_headings(lines) if doc.kind == "rst" else markdown_headings(lines)
    sections = []       # [start, end) line indices, heading path, has text besides the heading
    if not heads or heads[0][0] > 0:
        sections.append((0, heads[0][0] if heads else len(lines), [], True))
    stack = []
    for k, (start, level, title, height) in enumerate(heads):
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        end = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
        has_body = any(line.strip() for line in lines[start + height:end])
        sections.append((start, end, [t for _, t in stack], has_body))
    line_tokens = [count_tokens(line) if line.strip() else 0 for line in lines]
    tok = [sum(line_tokens[s:e]) for s, e, _, _ in sections]
    small = max(1, size // 8)     # a heading and a sentence or so
    out = []
    i = 0
    while i < len(sections):
        start, end, path, _ = sections[i]
        total, j = tok[i], i + 1
        parent = path[:-1]
        while (j < len(sections) and total < small and total + tok[j] <= size
               and sections[j][2][:len(parent)] == parent):
            total += tok[j]
            end = sections[j][1]
            j += 1
        # The path is what the merged sections with text share; a bare parent
        # heading, front matter or an intro before the first heading does not
        # take the path away from the section it was merged into.
        group = sections[i:j]
        paths = [p for _, _, p, body in group if body and p] or [p for _, _, p, _ in group]
        headings = _common_prefix(paths)
        if total == 0:
            pass
        elif total <= size:
            lo, hi = start, end
            while lo < hi and not lines[lo].strip():
                lo += 1
            while hi > lo and not lines[hi - 1].strip():
                hi -= 1
            text = "\n".join(line.rstrip() for line in lines[lo:hi])
            if text.strip():
                out.append((text, lo + 1, hi, headings))
        else:
            out.extend((t, s, e, headings) for t, s, e in _token_pieces(lines, start, end, size, overlap))
        i = j
    return out


def _common_prefix(paths):
    first = paths[0]
    n = len(first)
    for p in paths[1:]:
        n = min(n, len(p))
        for k in range(n):
            if p[k] != first[k]:
                n = k
                break
    return list(first[:n])


# --------------------------------------------------------------------------
# Code strategy: segments are (start, end, symbol, is_symbol), 1-based inclusive
# line numbers; glue segments (is_symbol False) hold whatever lies between
# definitions and carry the enclosing container's name as their symbol.

_PY_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_PY_COMPOUND = tuple(getattr(ast, name) for name in ("If", "Try", "TryStar", "With", "AsyncWith")
                     if hasattr(ast, name))


def _python_segments(text, lines):
    """Segments from ``ast``, or None if the file does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # SyntaxWarning for "\d" and friends
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, None
    out = []
    cursor = _py_collect(tree.body, lines, 1, "", out)
    if cursor <= len(lines):
        out.append((cursor, len(lines), "", False))
    return out, tree


def _py_start(node, lines, cursor):
    """First line of a definition: its decorators and the comment lines right
    above it (no blank line between), but never before ``cursor``."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    while start - 1 >= cursor and lines[start - 2].lstrip().startswith("#"):
        start -= 1
    return start


def _py_has_defs(node):
    for body in _py_bodies(node):
        for st in body:
            if isinstance(st, _PY_DEFS) or (isinstance(st, _PY_COMPOUND) and _py_has_defs(st)):
                return True
    return False


def _py_bodies(node):
    bodies = [node.body]
    bodies.extend(h.body for h in getattr(node, "handlers", ()))
    bodies.append(getattr(node, "orelse", []))
    bodies.append(getattr(node, "finalbody", []))
    return bodies


def _py_collect(stmts, lines, cursor, prefix, out):
    glue_symbol = prefix[:-1]
    for node in stmts:
        if node.end_lineno < cursor:
            continue
        if isinstance(node, _PY_DEFS):
            start = _py_start(node, lines, cursor)
            if start > cursor:
                out.append((cursor, start - 1, glue_symbol, False))
            qual = prefix + node.name
            members = [n for n in node.body if isinstance(n, _PY_DEFS)] \
                if isinstance(node, ast.ClassDef) else []
            if members:
                k = node.body.index(members[0])
                above = node.body[k - 1].end_lineno + 1 if k else node.lineno + 1
                header_end = _py_start(members[0], lines, above) - 1
                out.append((start, header_end, qual, True))
                inner = _py_collect(node.body, lines, header_end + 1, qual + ".", out)
                if inner <= node.end_lineno:
                    out.append((inner, node.end_lineno, qual, False))
            else:
                out.append((start, node.end_lineno, qual, True))
            cursor = node.end_lineno + 1
        elif isinstance(node, _PY_COMPOUND) and _py_has_defs(node):
            for body in _py_bodies(node):
                cursor = _py_collect(body, lines, cursor, prefix, out)
    return cursor


def _py_line_scores(tree, lines, lo, hi):
    """Cut preference before each 0-based line lo..hi of a Python file:
    statement starts, shallow ones first; comments opening a paragraph rank
    with them.  Only statements overlapping the range are visited."""
    scores = dict.fromkeys(range(lo, hi + 1), 0)
    first, last = lo + 1, hi + 1
    todo = [(tree.body, 0)]
    while todo:
        body, depth = todo.pop()
        for st in body:
            if st.end_lineno < first:
                continue
            if st.lineno > last:
                break
            line = st.lineno
            for d in getattr(st, "decorator_list", ()):
                line = min(line, d.lineno)
            if first <= line <= last:
                scores[line - 1] = max(scores[line - 1], 6 - min(depth, 5))
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(st, field, None)
                if sub and isinstance(sub, list) and isinstance(sub[0], ast.stmt):
                    todo.append((sub, depth + 1))
            for item in getattr(st, "handlers", ()) or getattr(st, "cases", ()):
                todo.append((item.body, depth + 1))
    for i in range(max(lo, 1), hi + 1):
        if not lines[i - 1].strip():
            if scores[i]:
                scores[i] += 1
            elif lines[i].lstrip().startswith("#"):
                scores[i] = 4
    return scores


# -- heuristic analysis for other languages

class _Syntax:
    __slots__ = ("comments", "block", "quotes", "char_quote", "multiline", "brackets", "family")

    def __init__(self, family, comments=("//",), block=("/*", "*/"), quotes="\"'",
                 char_quote=False, multiline=(), brackets="{}()[]"):
        self.family = family
        self.comments = comments
        self.block = block
        self.quotes = quotes
        self.char_quote = char_quote        # '...' holds one character (C, Rust, Go)
        self.multiline = multiline          # string delimiters that may span lines
        self.brackets = brackets


_C_SYNTAX = _Syntax("c", char_quote=True)
_SYNTAXES = {
    "c": _C_SYNTAX, "cpp": _C_SYNTAX, "java": _C_SYNTAX, "csharp": _C_SYNTAX,
    "objc": _C_SYNTAX, "proto": _C_SYNTAX, "zig": _C_SYNTAX,
    "rust": _Syntax("c", char_quote=True),
    "go": _Syntax("c", char_quote=True, multiline=("`",)),
    "kotlin": _Syntax("c", multiline=('"""',)), "scala": _Syntax("c", multiline=('"""',)),
    "swift": _Syntax("c", multiline=('"""',)), "groovy": _Syntax("c", multiline=("'''", '"""')),
    "dart": _Syntax("c", multiline=("'''", '"""')),
    "javascript": _Syntax("js", multiline=("`",)), "typescript": _Syntax("js", multiline=("`",)),
    "vue": _Syntax("js", multiline=("`",)), "svelte": _Syntax("js", multiline=("`",)),
    "php": _Syntax("js", comments=("//", "#")),
    "python": _Syntax("py", comments=("#",), block=None, multiline=('"""', "'''")),
    "ruby": _Syntax("ruby", comments=("#",), block=None), "perl": _Syntax("ruby", comments=("#",), block=None),
    "elixir": _Syntax("ruby", comments=("#",), block=None, multiline=('"""',)),
    "julia": _Syntax("ruby", comments=("#",), block=None, multiline=('"""',)),
    "nim": _Syntax("py", comments=("#",), block=None, multiline=('"""',)),
    "shell": _Syntax("shell", comments=("#",), block=None, brackets="{}"),
    "powershell": _Syntax("shell", comments=("#",), block=("<#", "#>")),
    "make": _Syntax("make", comments=("#",), block=None, brackets=""),
    "docker": _Syntax("make", comments=("#",), block=None, brackets=""),
    "cmake": _Syntax("shell", comments=("#",), block=None, brackets="()"),
    "r": _Syntax("js", comments=("#",), block=None),
    "lua": _Syntax("lua", comments=("--",), block=("--[[", "]]")),
    "sql": _Syntax("sql", comments=("--",), quotes="'\"", brackets="()"),
    "haskell": _Syntax("ruby", comments=("--",), block=("{-", "-}")),
    "ocaml": _Syntax("ruby", comments=(), block=("(*", "*)")),
    "fsharp": _Syntax("ruby", comments=("//",), block=("(*", "*)")),
    "erlang": _Syntax("ruby", comments=("%",), block=None), "matlab": _Syntax("ruby", comments=("%",), block=None),
    "lisp": _Syntax("ruby", comments=(";",), block=None, brackets=""),
    "clojure": _Syntax("ruby", comments=(";",), block=None, brackets=""),
    "vim": _Syntax("ruby", comments=('"',), block=None, quotes="'", brackets=""),
    "batch": _Syntax("ruby", comments=("REM ", "::"), block=None, brackets=""),
    "hcl": _Syntax("c", comments=("//", "#")), "graphql": _Syntax("c", comments=("#",), block=None),
    "yaml": _Syntax("config", comments=("#",), block=None, brackets="{}[]"),
    "toml": _Syntax("config", comments=("#",), block=None, multiline=('"""', "'''"), brackets="{}[]"),
    "ini": _Syntax("config", comments=("#", ";"), block=None, brackets=""),
    "json": _Syntax("config", comments=("//",), quotes='"', brackets="{}[]"),
    "css": _Syntax("config", comments=("//",), brackets="{}"),
    "xml": _Syntax("config", comments=(), block=("<!--", "-->"), quotes="", brackets=""),
}
_DEFAULT_SYNTAX = _Syntax("c", comments=("//", "#"))

_CONTINUATION_RE = re.compile(
    r"^(?:[})\]{.?:,|&+*/=]|->|=>|(?:else|elif|elsif|except|catch|finally|rescue|ensure"
    r"|end|fi|done|esac|then|do|in|when|where|and|or)\b)")
_CONTINUED_RE = re.compile(r"(?:\\|=|&&|\|\||\+|\bor|\band)\s*$")


class _CodeLines:
    """Per-line facts for the heuristic: bracket depth at the line start,
    indentation, and whether the line is blank, comment-only or inside a
    multi-line string or comment."""

    def __init__(self, lines, syntax):
        self.lines = lines
        n = len(lines)
        self.depth = [0] * (n + 1)
        self.indent = [0] * n
        self.blank = [False] * n
        self.comment = [False] * n
        self.inside = [False] * n          # starts inside a multi-line construct
        self.tokens = None
        opens = {c: 1 for c in syntax.brackets[0::2]}
        opens.update({c: -1 for c in syntax.brackets[1::2]})
        alts = [re.escape(d) for d in sorted(syntax.multiline, key=len, reverse=True)]
        if syntax.block:
            alts.append(re.escape(syntax.block[0]))
        alts.extend(re.escape(c) for c in sorted(syntax.comments, key=len, reverse=True))
        if syntax.quotes:
            alts.append("[%s]" % re.escape(syntax.quotes))
        if syntax.brackets:
            alts.append("[%s]" % re.escape(syntax.brackets))
        scan = re.compile("|".join(alts)) if alts else None
        strings = {q: re.compile(r"%s(?:\\.|[^\\%s])*%s" % (q, q, q)) for q in syntax.quotes}
        char_re = re.compile(r"'(?:\\.[^']{0,8}|[^\\'])'")
        depth = 0
        state = None                        # closing delimiter of an open construct
        for i, line in enumerate(lines):
            stripped = line.strip()
            if (syntax.family == "py" and depth and state is None and line[:1].isalpha()
                    or line[:1] == "@" and syntax.family == "py"):
                depth = 0       # an unclosed bracket (syntax error) ends at the next top-level line
            self.depth[i] = depth
            self.blank[i] = not stripped
            self.inside[i] = state is not None
            body = line.expandtabs(4)
            self.indent[i] = len(body) - len(body.lstrip())
            if syntax.comments and stripped.startswith(syntax.comments):
                self.comment[i] = True
            elif syntax.block and stripped.startswith(syntax.block[0]):
                self.comment[i] = True
            elif state is not None and state == (syntax.block[1] if syntax.block else None):
                self.comment[i] = True
            if scan is None:
                continue
            pos = 0
            end = len(line)
            while pos < end:
                if state is not None:
                    k = line.find(state, pos)
                    if k < 0:
                        break
                    pos = k + len(state)
                    state = None
                    continue
                m = scan.search(line, pos)
                if not m:
                    break
                tok = m.group()
                if tok in opens:
                    depth = max(0, depth + opens[tok])
                    pos = m.end()
                elif tok in syntax.multiline:
                    k = line.find(tok, m.end())
                    if k < 0:
                        state = tok
                        break
                    pos = k + len(tok)
                elif syntax.block and tok == syntax.block[0]:
                    state = syntax.block[1]
                    pos = m.end()
                elif tok in syntax.comments:
                    if tok == "#" and syntax.family in ("shell", "make") and m.start() > 0 \
                            and not line[m.start() - 1].isspace():
                        pos = m.end()               # $# and ${#x} are not comments
                        continue
                    break
                elif tok == "'" and syntax.char_quote:
                    c = char_re.match(line, m.start())
                    pos = c.end() if c else m.end()
                else:
                    s = strings[tok].match(line, m.start())
                    if not s:
                        break                       # unterminated: rest of line is string
                    pos = s.end()
        self.depth[n] = depth

    def token_count(self, i):
        if self.tokens is None:
            self.tokens = [None] * len(self.lines)
        t = self.tokens[i]
        if t is None:
            t = self.tokens[i] = count_tokens(self.lines[i]) if not self.blank[i] else 0
        return t

    def is_continuation(self, i):
        if self.comment[i]:
            return False
        stripped = self.lines[i].lstrip()
        if _CONTINUATION_RE.match(stripped):
            return True
        j = i - 1
        while j >= 0 and self.blank[j]:
            j -= 1
        return j >= 0 and j == i - 1 and not self.comment[j] and bool(_CONTINUED_RE.search(self.lines[j]))


_LEAD_RE = re.compile(r"^(?:@[\w.]+(?!.*\{\s*$)|#!?\[|template\s*<)")
_CSHARP_ATTRIBUTE_RE = re.compile(r"^\[[\w.]+(?:\(.*\))?\]\s*$")
_C_TYPE_LINE_RE = re.compile(r"^(?:[A-Za-z_]\w*[\s*]+)*[A-Za-z_]\w*[\s*]*$")   # GNU "static int" above a name
_ANNOTATIONS_RE = re.compile(r"^(?:@[\w.]+(?:\([^)]*\))?\s+)+")

_MODIFIERS = (r"(?:(?:export|default|public|private|protected|internal|abstract|final|sealed|static"
              r"|partial|data|open|inner|override|async|inline|suspend|unsafe|extern(?:\s+\"C\")?"
              r"|local|fileprivate|mutating|declare|readonly|virtual|const|pub(?:\([^)]*\))?)\s+)*")
_NAME = r"[A-Za-z_$][\w$]*(?:(?:::|\.)[A-Za-z_$~][\w$]*)*"     # a.b, A::b
_CONTAINER_RE = re.compile(
    r"^" + _MODIFIERS + r"(?:class|interface|struct|enum|trait|module|namespace|object|protocol"
    r"|extension|record|union|mixin|actor|defmodule|impl)\b(?:\s*<[^>]*>)?\s+(?:[\w:<>, ]+?\s+for\s+)?"
    r"(" + _NAME + r")")
_FUNCTION_RE = re.compile(
    r"^" + _MODIFIERS + r"(?:function\*?|func|fn|fun|def|defp|defmacro|sub|proc|procedure|method)\s+"
    r"(?:\[[^\]]*\]\s*=\s*|\w+\s*=\s*(?=\w+\s*\())?(?:<[^>]*>\s*)?(" + _NAME + r"[!?]?)")
_GO_METHOD_RE = re.compile(r"^func\s*\(\s*(?:\w+\s+)?\*?\s*(\w+)(?:\[[^\]]*\])?\s*\)\s*(\w+)")
_TYPE_RE = re.compile(r"^(?:export\s+)?type\s+([A-Za-z_]\w*)")
_JS_VAR_FUNC_RE = re.compile(
    r"^(?:export\s+)?(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*(?::[^=]+)?=\s*(?:async\s+)?"
    r"(?:function\b|\([^)]*\)\s*(?::[^=]+)?=>|[A-Za-z_$][\w$]*\s*=>)")
_ASSIGNED_FUNC_RE = re.compile(r"^(?:local\s+)?(" + _NAME + r")\s*(?:=|<-)\s*(?:async\s+)?function\b")
_SHELL_FUNC_RE = re.compile(r"^(?:function\s+)?([A-Za-z_][\w.:-]*)\s*\(\s*\)\s*\{?\s*$|^function\s+([\w.:-]+)")
_METHOD_RE = re.compile(
    r"^(?:[\w<>\[\],.?*&:~@]+(?:\s+|\s*[*&]+\s*))*?\*?([A-Za-z_$~][\w$:~]*)\s*(?:<[^>()]*>)?\s*"
    r"\((?![\"'`\d])[^;]*$")
_CALLBACK_RE = re.compile(r"=>|\bfunction\b")
_NOT_FUNCTIONS = {
    "if", "for", "while", "switch", "catch", "return", "new", "else", "do", "sizeof",
    "typeof", "throw", "await", "yield", "case", "with", "foreach", "using", "lock",
    "elif", "until", "unless", "fixed", "match", "when", "defer", "go", "print",
    "var", "let", "const", "import", "package", "super", "this", "assert",
}
_SQL_RE = re.compile(
    r"^create\s+(?:or\s+replace\s+)?(?:temp(?:orary)?\s+)?(?:unique\s+)?(?:table|view|function"
    r"|procedure|index|trigger|type|schema|sequence|materialized\s+view)\s+(?:if\s+not\s+exists\s+)?"
    r"([\w.\"`\[\]]+)", re.I)
_YAML_KEY_RE = re.compile(r"^([\w.$/-]+|\"[^\"]+\"|'[^']+')\s*:(?:\s|$)")
_TOML_SECTION_RE = re.compile(r"^\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY_VALUE_RE = re.compile(r"^([\w.-]+)\s*[=:]")
_JSON_KEY_RE = re.compile(r"^\"([^\"]+)\"\s*:")
_MAKE_TARGET_RE = re.compile(r"^([\w./%${}() -]+?)\s*::?(?!=)")


def _detect_symbol(sig, syntax, language):
    """(name, is_container) for a unit whose first code line is ``sig``."""
    sig = _ANNOTATIONS_RE.sub("", sig)
    if syntax.family == "config":
        for rx in (_TOML_SECTION_RE, _JSON_KEY_RE, _YAML_KEY_RE, _KEY_VALUE_RE):
            m = rx.match(sig)
            if m:
                return m.group(1).strip("\"'"), False
        return None, False
    if syntax.family == "make":
        m = _MAKE_TARGET_RE.match(sig)
        return (m.group(1).strip(), False) if m and language == "make" else (None, False)
    if syntax.family == "sql":
        m = _SQL_RE.match(sig)
        return (m.group(1).strip("\"`[]"), False) if m else (None, False)
    if language == "go":
        m = _GO_METHOD_RE.match(sig)
        if m:
            return m.group(1) + "." + m.group(2), False
    m = _CONTAINER_RE.match(sig)
    if m:
        return m.group(1), True
    m = _FUNCTION_RE.match(sig)
    if m:
        name = m.group(1)
        return (name[5:] if name.startswith("self.") else name), False
    if syntax.family == "shell":
        m = _SHELL_FUNC_RE.match(sig)
        return ((m.group(1) or m.group(2)), False) if m else (None, False)
    m = _TYPE_RE.match(sig) if language in ("go", "typescript") else None
    if m:
        return m.group(1), False
    for rx in (_JS_VAR_FUNC_RE, _ASSIGNED_FUNC_RE):
        m = rx.match(sig)
        if m:
            return m.group(1), False
    if syntax.family in ("c", "js") and not sig.rstrip().endswith(";"):
        m = _METHOD_RE.match(sig)
        # "name(args) {" defines; "name(() => {" and "name(function () {" call.
        if m and m.group(1) not in _NOT_FUNCTIONS and not _CALLBACK_RE.search(sig, m.end(1)):
            return m.group(1), False
    return None, False


def _heuristic_segments(code, syntax, language, lo, hi, prefix, limit, out):
    """Segments for 0-based lines lo..hi (inclusive) at one nesting level:
    a unit starts at each line of the shallowest bracket depth and
    indentation, together with the comments and annotations right above it."""
    lines = code.lines
    glue_symbol = prefix[:-1]
    cands = [i for i in range(lo, hi + 1)
             if not code.blank[i] and not code.inside[i] and not code.is_continuation(i)]
    if not cands:
        out.append((lo + 1, hi + 1, glue_symbol, False))
        return
    base_depth = min(code.depth[i] for i in cands)
    base_indent = min(code.indent[i] for i in cands if code.depth[i] == base_depth)
    bounds = [i for i in cands if code.depth[i] == base_depth and code.indent[i] <= base_indent]
    if language in ("toml", "ini"):
        sections = [i for i in bounds if _TOML_SECTION_RE.match(lines[i].strip())]
        bounds = sections or bounds

    def is_lead(i):
        if code.comment[i] or code.inside[i]:
            return True
        if syntax.family == "config":
            return False
        stripped = lines[i].strip()
        if _LEAD_RE.match(stripped):
            return True
        if language == "csharp" and _CSHARP_ATTRIBUTE_RE.match(stripped):
            return True
        return (syntax.family == "c" and code.indent[i] == 0 and i + 1 <= hi
                and not code.blank[i + 1] and _C_TYPE_LINE_RE.match(stripped) is not None)

    starts = []
    for b in bounds:
        if is_lead(b):
            continue
        s = b
        while s - 1 >= lo and not code.blank[s - 1] and is_lead(s - 1):
            s -= 1
        if not starts or s > starts[-1]:
            starts.append(s)
    if not starts or starts[0] > lo:
        starts.insert(0, lo)
    for k, s in enumerate(starts):
        e = starts[k + 1] - 1 if k + 1 < len(starts) else hi
        while e > s and code.blank[e]:
            e -= 1
        real = s
        while real < e and (code.blank[real] or is_lead(real)):
            real += 1
        name, container = (None, False) if is_lead(real) else \
            _detect_symbol(lines[real].strip(), syntax, language)
        qual = prefix + name.replace("::", ".") if name else glue_symbol
        if e > real and (container or sum(code.token_count(i) for i in range(s, e + 1)) > limit):
            # A class-like block, or a big one: its members become chunks of their own.
            body_lo, body_hi = _block_body(code, real, e)
            if body_lo is not None:
                inner = []
                inner_prefix = qual + "." if name else prefix
                _heuristic_segments(code, syntax, language, body_lo, body_hi, inner_prefix, limit, inner)
                first = next((seg for seg in inner if seg[3]), None)
                if first is not None:
                    out.append((s + 1, first[0] - 1, qual, name is not None))
                    out.extend(seg for seg in inner if seg[0] >= first[0])
                    if body_hi < e:
                        out.append((body_hi + 2, e + 1, qual, False))
                    continue
        out.append((s + 1, e + 1, qual, name is not None))


def _block_body(code, real, e):
    """0-based (first, last) body lines of the block opened at line ``real``:
    by brackets when the block opens one, else by indentation."""
    d = code.depth[real]
    for h in range(real, min(e, real + 8) + 1):
        if code.depth[h + 1] > d:
            last = h
            for i in range(h + 1, e + 1):
                if code.depth[i] > d and not code.blank[i]:
                    last = i
            # the closing line starts inside the block but belongs to the header's brace
            if last > h and code.lines[last].lstrip()[:1] in ")]}" and code.depth[last + 1] <= d:
                last -= 1
            return (h + 1, last) if last > h else (None, None)
    ind = code.indent[real]
    body = [i for i in range(real + 1, e + 1) if not code.blank[i] and code.indent[i] > ind]
    return (body[0], body[-1]) if body else (None, None)


def _heuristic_line_scores(code, lo, hi):
    scores = {}
    d0 = code.depth[lo]
    for i in range(lo, hi + 1):
        if code.blank[i] or code.inside[i] or code.is_continuation(i):
            scores[i] = 0
            continue
        s = 1 + max(0, 3 - (code.depth[i] - d0))
        if i > 0 and code.blank[i - 1]:
            s += 2
        scores[i] = s
    return scores


def _code_pieces(doc, lines, size, pack_symbols=True):
    """[(text, line_start, line_end, symbol)] for source code and config files."""
    language = doc.language or ""
    segments = tree = None
    if language == "python":
        segments, tree = _python_segments(doc.text, lines)
    if segments is not None:
        def scores_for(lo, hi):
            return _py_line_scores(tree, lines, lo, hi)
        counts = None
    else:
        syntax = _SYNTAXES.get(language) or (_DEFAULT_SYNTAX if doc.kind == "code" else
                                              _Syntax("config", comments=("#",), block=None))
        code = _CodeLines(lines, syntax)
        segments = []
        try:
            _heuristic_segments(code, syntax, language, 0, len(lines) - 1, "", size, segments)
        except RecursionError:      # absurd nesting: plain line packing below
            segments = [(1, len(lines), "", False)]

        def scores_for(lo, hi):
            return _heuristic_line_scores(code, lo, hi)
        counts = code
    segments = _tidy_segments(segments, lines)
    if doc.kind == "config":
        segments = _pack_config(segments, lines, size)
    elif pack_symbols:
        segments = _pack_small_symbols(segments, lines, size)
    out = []
    for start, end, symbol, is_symbol in segments:
        text = "\n".join(lines[start - 1:end])
        if not is_symbol and len(WORD_RE.findall(text, 0, 200)) < 2:
            continue    # "}", "end", "else:" left between definitions
        n = count_tokens(text)
        if n <= size:
            out.append((text, start, end, symbol))
            continue
        lo, hi = start - 1, end - 1
        tokens = [counts.token_count(i) if counts else count_tokens(lines[i]) for i in range(lo, hi + 1)]
        sc = scores_for(lo, hi)
        for a, b in _pack(tokens, [sc[i] for i in range(lo, hi + 1)], size, 0):
            s, e = lo + a, lo + b - 1
            while s < e and not lines[s].strip():
                s += 1
            while e > s and not lines[e].strip():
                e -= 1
            piece = "\n".join(lines[s:e + 1])
            if s == e and tokens[s - lo] > size:
                # One huge line (data, a long literal): cut between words;
                # every piece cites that line.
                out.extend((part.strip(), s + 1, s + 1, symbol)
                           for part in _hard_split(piece, size) if part.strip())
            elif piece.strip():
                out.append((piece, s + 1, e + 1, symbol))
    return out


def _tidy_segments(segments, lines):
    """Trim blank edges, drop empty segments, merge neighbouring glue."""
    out = []
    for start, end, symbol, is_symbol in segments:
        while start <= end and not lines[start - 1].strip():
            start += 1
        while end >= start and not lines[end - 1].strip():
            end -= 1
        if start > end:
            continue
        if out and not is_symbol and not out[-1][3] and out[-1][2] == symbol \
                and all(not lines[i].strip() for i in range(out[-1][1], start - 1)):
            out[-1] = (out[-1][0], end, symbol, False)
        else:
            out.append((start, end, symbol, is_symbol))
    return out


def _pack_small_symbols(segments, lines, size):
    """Code: neighbouring segments under half a chunk share chunks of up to
    ``size`` tokens, so a stub file or a run of one-line definitions gives
    about its size over ``size`` chunks, not one per definition (numpy's
    __init__.pyi gave 1,721 for 73k tokens).  A segment of half a chunk or
    more stays a chunk of its own.  Cuts fall between top-level definitions
    where they can, and never inside a run of overloads of one name when
    another place keeps the chunk half full.  A merged chunk's symbol names
    its definitions in order ("a, b, c"); see _group_symbol."""
    # "}" or "end" between definitions is no unit of its own: it is dropped
    # alone (see _code_pieces) and simply lies inside a group that spans it.
    segments = [seg for seg in segments
                if seg[3] or len(WORD_RE.findall("\n".join(lines[seg[0] - 1:seg[1]]), 0, 200)) >= 2]
    # A unit's tokens include the lines since the previous segment, so a
    # group's sum never falls short of its text's.
    tokens, prev_end = [], 0
    for start, end, _, _ in segments:
        tokens.append(count_tokens("\n".join(lines[prev_end:end])))
        prev_end = end
    out, k = [], 0
    while k < len(segments):
        if tokens[k] * 2 >= size:
            out.append(segments[k])
            k += 1
            continue
        run = k
        while k < len(segments) and tokens[k] * 2 < size:
            k += 1
        group_of = segments[run:k]
        scores = [_cut_score(group_of[i - 1][2], seg[2]) if i else 0 for i, seg in enumerate(group_of)]
        for a, b in _pack(tokens[run:k], scores, size, 0):
            group = group_of[a:b]
            out.append(group[0] if len(group) == 1 else
                       (group[0][0], group[-1][1], _group_symbol(group), any(g[3] for g in group)))
    return out


def _cut_score(before, after):
    """How good a place between segments named ``before`` and ``after`` is to end a chunk."""
    if before == after:
        return 0        # overloads of one function, or glue inside one class
    return 2 if before.split(".", 1)[0] != after.split(".", 1)[0] else 1


_GROUP_NAMES = 6


def _group_symbol(group):
    """The symbol of segments merged into one chunk: the distinct names of its
    definitions in order, the first few of them ("a, b, c, ..."); for glue
    alone, the container it is in."""
    names = list(dict.fromkeys(g[2] for g in group if g[3] and g[2]))
    if not names:
        paths = [g[2].split(".") for g in group]
        return ".".join(_common_prefix(paths)) if all(g[2] for g in group) else ""
    return ", ".join(names[:_GROUP_NAMES]) + (", ..." if len(names) > _GROUP_NAMES else "")


def _pack_config(segments, lines, size):
    """Config files: small consecutive sections share a chunk; its symbol is
    the longest dotted prefix the sections' keys have in common."""
    if not segments:
        return segments
    tokens = [count_tokens("\n".join(lines[s - 1:e])) for s, e, _, _ in segments]
    out = []
    for a, b in _pack(tokens, [1] * len(segments), size, 0):
        group = segments[a:b]
        if len(group) == 1:
            out.append(group[0])
            continue
        names = [g[2].split(".") for g in group if g[2]]
        symbol = ".".join(_common_prefix(names)) if len(names) == len(group) else ""
        out.append((group[0][0], group[-1][1], symbol, any(g[3] for g in group)))
    return out


# --------------------------------------------------------------------------
# chunk_document

_STRATEGIES = ("auto", "token", "paragraph", "heading", "code")
_AUTO_STRATEGY = {
    "code": "code", "config": "code", "markdown": "heading", "rst": "heading",
    "html": "heading", "docx": "heading",
}


def chunk_document(doc, strategy="auto", chunk_size=DEFAULT_CHUNK_SIZE, chunk_overlap=None, pack_symbols=True):
    """Chunks of ``doc``.  ``strategy``: auto (by document kind), token,
    paragraph, heading or code; sizes in estimated tokens (count_tokens).
    ``chunk_overlap`` None means chunk_size // 8 (DEFAULT_CHUNK_OVERLAP for
    the default size); only the token strategy and split sections overlap.
    ``pack_symbols`` False gives code one chunk per definition however small,
    instead of packing small neighbours together (_pack_small_symbols)."""
    if chunk_overlap is None and isinstance(chunk_size, int):
        chunk_overlap = chunk_size // 8
    if strategy not in _STRATEGIES:
        raise ValueError("unknown chunking strategy %r (expected one of %s)"
                         % (strategy, ", ".join(_STRATEGIES)))
    if not isinstance(chunk_size, int) or chunk_size < 16:
        raise ValueError("chunk_size must be an integer >= 16, got %r" % (chunk_size,))
    if not isinstance(chunk_overlap, int) or not 0 <= chunk_overlap <= chunk_size // 2:
        raise ValueError("chunk_overlap must be between 0 and chunk_size/2 (%d), got %r"
                         % (chunk_size // 2, chunk_overlap))
    if strategy == "auto":
        strategy = _AUTO_STRATEGY.get(doc.kind, "token")
    lines = doc.text.split("\n")
    raw = []        # (text, line_start, line_end, headings, symbol)
    if not doc.text.strip():
        pass
    elif strategy == "code":
        raw = [(t, s, e, [], sym) for t, s, e, sym in _code_pieces(doc, lines, chunk_size, pack_symbols)]
    elif strategy == "heading":
        raw = [(t, s, e, h, "") for t, s, e, h in _heading_pieces(doc, lines, chunk_size, chunk_overlap)]
    elif strategy == "paragraph":
        raw = [(t, s, e, [], "") for t, s, e in _paragraph_pieces(lines, chunk_size)]
    else:
        raw = [(t, s, e, [], "") for t, s, e in
               _token_pieces(lines, 0, len(lines), chunk_size, chunk_overlap)]
    if doc.page_starts:
        raw = [(t, s, e, _page_label(doc.page_starts, s, e), sym) for t, s, e, _, sym in raw]
    return _finalize(doc, raw, strategy)


def _page_label(page_starts, start, end):
    first = bisect.bisect_right(page_starts, start)
    last = bisect.bisect_right(page_starts, end)
    return ["page %d" % first] if first == last else ["pages %d-%d" % (first, last)]


def _finalize(doc, raw, strategy):
    chunks = []
    seen = collections.Counter()
    code = strategy == "code"
    for text, start, end, headings, symbol in raw:
        if code:
            context = "%s: %s" % (doc.source, symbol) if symbol else doc.source
        else:
            path = [doc.title] if doc.title else []
            path += headings[1:] if headings and headings[0] == doc.title else headings
            context = " > ".join(path)
        index = context + "\n" + text if context else text
        digest = hashlib.sha256(index.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        ordinal = seen[digest]
        seen[digest] += 1
        key = "%s\0%s\0%d" % (doc.source, digest, ordinal)
        chunk_id = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        chunks.append(Chunk(chunk_id, text, doc.source, doc.title, list(headings), symbol,
                            start, end, digest, context))
    return chunks
