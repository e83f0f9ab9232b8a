"""The YAML subset that config files are written in: parse_yaml, load_yaml, dump_yaml, format_path.

config.yaml is read with PyYAML when it is installed (``deps.yaml``) and with
parse_yaml() otherwise; both paths return the same ``(data, positions)`` and
refuse the same unsupported features and the same nesting beyond MAX_NESTING,
so a config never means two different things and no text, however deep,
raises anything but YAMLError.  parse_yaml's docstring has the grammar;
errors carry line and column.
dump_yaml writes what the admin API saves back; format_path names a key path in errors.

May import: deps.
"""
from __future__ import annotations

import bisect
import datetime
import functools
import math
import re

from . import deps

_YAML_BLANK = " \t\n\0"          # "\0" is the end-of-text sentinel
_YAML_INDICATORS = "-?:,[]{}#&*!|>'\"%@`"
_YAML_NULLS = frozenset(("", "~", "null", "Null", "NULL"))
_YAML_BOOLS = {spelling: value
               for word, value in (("yes", True), ("true", True), ("on", True),
                                   ("no", False), ("false", False), ("off", False))
               for spelling in (word, word.capitalize(), word.upper())}
# YAML 1.1 as PyYAML's SafeLoader resolves it: "0o17", "1e3" and "-.5" stay strings.
_YAML_INT = re.compile(r"[-+]?(?:0b[01_]+|0x[0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*(?::[0-5]?[0-9])*)")
_YAML_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*(?:[eE][-+][0-9]+)?"
                         r"|(?::[0-5]?[0-9])+\.[0-9_]*)|\.(?:inf|Inf|INF))"
                         r"|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|\.(?:nan|NaN|NAN)")
_YAML_TIMESTAMP = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})"
                             r"(?:(?:[Tt]|[ \t]+)([0-9]{1,2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]*))?"
                             r"(?:[ \t]*(Z|([-+])([0-9]{1,2})(?::([0-9]{2}))?))?)?")
_YAML_WORD_BLOCK = r"(?:[^ \t\n\0:]|:(?![ \t\n\0]))"
_YAML_WORD_FLOW = r"(?:[^ \t\n\0:,?\[\]{}]|:(?![ \t\n\0,\[\]{}]))"
# One line of a plain scalar: words separated by spaces; " #" starts a comment.
_YAML_PLAIN_BLOCK = re.compile("%s+(?: +(?!#)%s+)*" % (_YAML_WORD_BLOCK, _YAML_WORD_BLOCK))
_YAML_PLAIN_FLOW = re.compile("%s+(?: +(?!#)%s+)*" % (_YAML_WORD_FLOW, _YAML_WORD_FLOW))
_YAML_SINGLE_RUN = re.compile(r"[^'\n\0]*")
_YAML_DOUBLE_RUN = re.compile(r'[^"\\\n\0]*')
_YAML_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v",
                 "f": "\f", "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\",
                 "N": "\x85", "_": "\xa0", "L": "\u2028", "P": "\u2029"}
_YAML_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}
# Control characters, and the Unicode line breaks NEL, LS and PS (YAML would
# count lines differently from every editor); both paths refuse them up front.
_YAML_BAD_CHARACTER = re.compile(
    "[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_YAML_UNSUPPORTED = {
    "&": "anchors ('&') are not supported",
    "*": "aliases ('*') are not supported",
    "!": "tags ('!') are not supported",
    "?": "complex keys ('? ') are not supported",
    "%": "directives ('%') are not supported",
    "<<": "merge keys ('<<') are not supported; quote the text if it is meant literally",
    "=": "a plain '=' is not supported; quote it",
}
_YAML_TAB = "tab characters are not allowed here; indent and separate with spaces"
#: Collections nested deeper than this are refused on both paths.  A config is a
#: few levels deep; the parsers recurse once or more per level, and Python's
#: recursion limit (1000 frames) must never be what stops a hostile file.
MAX_NESTING = 64
_YAML_TOO_DEEP = ("collections are nested more than %d levels deep (a config needs a few); "
                  "check for unclosed brackets" % MAX_NESTING)


class YAMLError(ValueError):
    """Malformed or unsupported YAML; ``line`` and ``col`` are 1-based."""

    def __init__(self, msg, line, col):
        super().__init__("line %d, column %d: %s" % (line, col, msg))
        self.msg, self.line, self.col = msg, line, col


def parse_yaml(text):
    r"""Parse the YAML subset used by config files; return ``(data, positions)``.

    ``positions`` maps key paths such as ``("models", 0, "name")`` (``()`` is the
    root) to the 1-based ``(line, col)`` where the value starts; for a mapping
    value, where its key starts.  Grammar (one document; indentation is spaces)::

        document     ::= [ "---" ] [ node ] { "..." }   "--- " may share a line
                                                   with a scalar or flow node
        node         ::= block-map | block-seq | block-scalar | flow-node
        block-map    ::= ( key ":" value )+        keys in one column, one per line
        key          ::= plain | single | double    on one line
        value        ::= node on the key's line (no block-map / block-seq there)
                       | nothing, then a more indented node on the next lines
                       | nothing, then a block-seq in the key's own column
        block-seq    ::= ( "-" [ node ] )+          dashes in one column
        block-scalar ::= ( "|" | ">" ) [ "+" | "-" ] [ 1-9 ] comment? NL lines
                                                   (indicators in either order)
        flow-node    ::= "[" [ entry ( "," entry )* [ "," ] ] "]"
                       | "{" [ pair ( "," pair )* [ "," ] ] "}" | scalar
        entry        ::= flow-node [ ":" [ flow-node ] ]   "k: v" is a one-key map
        pair         ::= scalar [ ":" [ flow-node ] ]
        scalar       ::= plain | "'" ( char | "''" )* "'" | '"' ( char | escape )* '"'
        escape       ::= \\ \" \/ \0 \a \b \t \n \v \f \r \e \N \_ \L \P "\ "
                       | \xXX | \uXXXX | \UXXXXXXXX | \ line-break
        nesting      ::= block-map, block-seq, "[", "{" and the one-key map of an
                       entry at most MAX_NESTING (64) deep; the root is level 1

    Plain and quoted scalars and flow collections may span lines (line breaks
    fold to spaces, blank lines to newlines).  Plain
    scalars resolve like PyYAML's SafeLoader (YAML 1.1): null ``~ null Null NULL``
    and empty; bool ``true false yes no on off`` in lower, Capitalised and UPPER
    case; int ``12 0x1F 017 0b101 1_000 1:30``; float ``1.5 1.0e+3 .5 .inf .nan``
    (``1e3`` and ``0o17`` stay strings); ``2024-01-31`` dates and timestamps.
    Comments start at ``#`` after whitespace.  A collection nested deeper than
    MAX_NESTING is a YAMLError at its first character (its first key, dash or
    bracket), on both paths, so no document, however deep, raises
    RecursionError.  Not supported, each a YAMLError at the offending
    character: anchors, aliases, tags, ``? `` and empty keys, collections as
    keys, merge keys, directives, several documents, tabs outside quoted/block
    scalars and comments, control characters and the Unicode line breaks
    U+0085/U+2028/U+2029.  Stricter than PyYAML: a duplicate key is an error.
    load_yaml() refuses the same things when it reads with PyYAML.
    """
    return _YamlParser(text).parse()


def load_yaml(text):
    """Like parse_yaml(), but read by PyYAML's SafeLoader when it is available."""
    if deps.yaml is None:
        return parse_yaml(text)
    _yaml_check_characters(text)
    loader = _strict_safe_loader(deps.yaml)(text)
    try:
        node = loader.get_single_node()
        positions = {}
        if node is None or _pyyaml_is_empty(node):
            return None, positions
        positions[()] = _pyyaml_mark(node.start_mark)
        return _pyyaml_value(loader, node, (), positions), positions
    except deps.yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        msg = exc.problem or exc.context or "invalid YAML"
        if exc.problem and exc.context:   # "but found ..." continues its context
            msg = ("%s, %s" % (exc.context, msg) if msg.startswith("but ")
                   else "%s (%s)" % (msg, exc.context))
        raise YAMLError(msg, *_pyyaml_mark(mark)) from None
    except YAMLError:
        raise
    except (ValueError, OverflowError) as exc:   # "\U00110000": PyYAML's scanner lets chr() fail
        raise YAMLError(str(exc), *_pyyaml_mark(loader.get_mark())) from None
    except RecursionError:   # the composer is held to MAX_NESTING; this is for a caller deep in its own stack
        raise YAMLError("nested too deeply for Python's recursion limit", *_pyyaml_mark(loader.get_mark())) from None
    finally:
        loader.dispose()


@functools.lru_cache(maxsize=None)
def _strict_safe_loader(yaml_module):
    """A SafeLoader that refuses, at the offending character, what parse_yaml() refuses."""
    def refuse(indicator):
        def fetch(self):
            mark = self.get_mark()
            raise YAMLError(_YAML_UNSUPPORTED[indicator], *_pyyaml_mark(mark))
        return fetch

    def nested(compose):
        # PyYAML's composer recurses once per level, and a RecursionError would
        # leave it half-way; count levels as parse_yaml does and stop first.
        def compose_collection(self, anchor):
            if self.nesting >= MAX_NESTING:
                raise YAMLError(_YAML_TOO_DEEP, *_pyyaml_mark(self.peek_event().start_mark))
            self.nesting += 1
            try:
                return compose(self, anchor)
            finally:
                self.nesting -= 1
        return compose_collection

    safe = yaml_module.SafeLoader
    return type("StrictSafeLoader", (safe,), {
        "fetch_anchor": refuse("&"), "fetch_alias": refuse("*"), "fetch_tag": refuse("!"),
        "fetch_key": refuse("?"), "fetch_directive": refuse("%"), "nesting": 0,
        "compose_sequence_node": nested(safe.compose_sequence_node),
        "compose_mapping_node": nested(safe.compose_mapping_node)})


def _yaml_check_characters(text):
    bad = _YAML_BAD_CHARACTER.search(text)
    if bad:
        at = bad.start()
        raise YAMLError("character U+%04X is not allowed; write it as an escape in a double-quoted"
                        " string" % ord(bad.group()), text.count("\n", 0, at) + 1,
                        at - text.rfind("\n", 0, at))


def _pyyaml_mark(mark):
    return mark.line + 1, mark.column + 1


def _pyyaml_is_empty(node):
    # PyYAML stands in an empty plain scalar where a node is missing.
    return isinstance(node, deps.yaml.ScalarNode) and node.style is None and node.value == ""


def _pyyaml_value(loader, node, path, positions):
    """Build the value of a composed node, recording positions and refusing duplicate keys."""
    if isinstance(node, deps.yaml.ScalarNode):
        for special in ("<<", "="):
            if node.style is None and node.value == special:
                raise YAMLError(_YAML_UNSUPPORTED[special], *_pyyaml_mark(node.start_mark))
        try:
            return loader.construct_object(node)
        except ValueError as exc:
            raise YAMLError("cannot read %r: %s" % (node.value, exc),
                            *_pyyaml_mark(node.start_mark)) from None
    if isinstance(node, deps.yaml.SequenceNode):
        items = []
        for index, child in enumerate(node.value):
            positions[path + (index,)] = _pyyaml_mark(child.start_mark)
            items.append(_pyyaml_value(loader, child, path + (index,), positions))
        return items
    mapping = {}
    for key_node, value_node in node.value:
        where = _pyyaml_mark(key_node.start_mark)
        if not isinstance(key_node, deps.yaml.ScalarNode):
            raise YAMLError("collections as mapping keys are not supported", *where)
        if _pyyaml_is_empty(key_node):
            raise YAMLError("empty mapping keys are not supported", *where)
        key = _pyyaml_value(loader, key_node, path, {})
        if key in mapping:
            raise YAMLError("duplicate key %r" % (key,), *where)
        positions[path + (key,)] = where
        mapping[key] = _pyyaml_value(loader, value_node, path + (key,), positions)
    return mapping


def _yaml_plain_value(text):
    """Resolve a plain scalar as YAML 1.1 does; ValueError for impossible numbers or dates."""
    if text in _YAML_NULLS:
        return None
    if text in _YAML_BOOLS:
        return _YAML_BOOLS[text]
    if _YAML_INT.fullmatch(text):
        digits = text.replace("_", "")
        sign = -1 if digits[0] == "-" else 1
        digits = digits.lstrip("+-")
        if digits[:2] in ("0b", "0x"):
            return sign * int(digits[2:], 2 if digits[1] == "b" else 16)
        if ":" in digits:
            return sign * _sexagesimal(digits, int)
        return sign * int(digits, 8 if digits[0] == "0" else 10)
    if _YAML_FLOAT.fullmatch(text):
        digits = text.replace("_", "").lower()
        sign = -1 if digits[0] == "-" else 1
        digits = digits.lstrip("+-")
        if digits in (".inf", ".nan"):
            return sign * math.inf if digits == ".inf" else math.nan
        return sign * (_sexagesimal(digits, float) if ":" in digits else float(digits))
    match = _YAML_TIMESTAMP.fullmatch(text)
    # Without a time part, PyYAML wants two-digit months and days.
    if match and (match.group(4) or len(match.group(2)) == len(match.group(3)) == 2):
        return _yaml_timestamp(match)
    return text


def _sexagesimal(digits, kind):
    # Least significant part first, so floats round exactly as PyYAML's do.
    value, base = kind(0), 1
    for part in reversed(digits.split(":")):
        value += kind(part) * base
        base *= 60
    return value


def _yaml_timestamp(match):
    year, month, day, hour, minute, second, fraction, tz, tz_sign, tz_hour, tz_minute = \
        match.groups()
    if hour is None:
        return datetime.date(int(year), int(month), int(day))
    tzinfo = None
    if tz_sign:
        offset = datetime.timedelta(hours=int(tz_hour), minutes=int(tz_minute or 0))
        tzinfo = datetime.timezone(-offset if tz_sign == "-" else offset)
    elif tz:
        tzinfo = datetime.timezone.utc
    return datetime.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                             int((fraction or "")[:6].ljust(6, "0")), tzinfo=tzinfo)


class _YamlParser:
    """One parse of one text.  Positions are indexes into ``self.text``; every
    method that reads a block node returns (value, position of the next content
    character), so callers decide by that character's column."""

    def __init__(self, text):
        _yaml_check_characters(text)
        if text.startswith("\ufeff"):
            text = text[1:]
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        self.end = len(text)
        self.text = text + "\0"
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.positions = {}
        self.opened = 0   # where the innermost collection began: a RecursionError's position

    # -- positions and errors ------------------------------------------------
    def mark(self, pos):
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def column(self, pos):
        return self.mark(pos)[1] - 1

    def error(self, msg, pos):
        return YAMLError(msg, *self.mark(pos))

    # -- whitespace, comments, document markers -------------------------------
    def skip_spaces(self, pos):
        while self.text[pos] == " ":
            pos += 1
        return pos

    def skip_void(self, pos):
        """Skip spaces, comments and line breaks up to the next content character."""
        text = self.text
        while True:
            pos = self.skip_spaces(pos)
            char = text[pos]
            if char == "#":
                pos = self.line_end(pos)
            elif char == "\n":
                pos += 1
            elif char == "\t":
                raise self.error(_YAML_TAB, pos)
            else:
                return pos

    def line_end(self, pos):
        """Position of the line break ending pos's line (the end of the text on the last line)."""
        found = self.text.find("\n", pos, self.end)
        return self.end if found < 0 else found

    def end_of_line(self, pos):
        """After a complete value only a comment may follow on its line."""
        pos = self.skip_spaces(pos)
        char = self.text[pos]
        if char in "#\n\0":
            return self.skip_void(pos)
        if char == ":":
            raise self.error("mapping values are not allowed here", pos)
        raise self.error(_YAML_TAB if char == "\t" else "unexpected text after the value", pos)

    def at_marker(self, pos):
        """True at a "---" or "..." document marker."""
        text = self.text
        return ((pos == 0 or text[pos - 1] == "\n") and text.startswith(("---", "..."), pos)
                and text[pos + 3] in _YAML_BLANK)

    def level(self, pos):
        """Indentation of the content at pos; -1 where the document ends."""
        return -1 if pos >= self.end or self.at_marker(pos) else self.column(pos)

    def is_entry(self, pos):
        return self.text[pos] == "-" and self.text[pos + 1] in _YAML_BLANK

    def nest(self, pos, path):
        """Refuse the collection starting at pos if it is too deep (its level is len(path) + 1)."""
        if len(path) >= MAX_NESTING:
            raise self.error(_YAML_TOO_DEEP, pos)
        self.opened = pos

    # -- document and block structure ------------------------------------------
    def parse(self):
        text = self.text
        pos = self.skip_void(0)
        if text[pos] == "%":
            raise self.error(_YAML_UNSUPPORTED["%"], pos)
        if text[pos] == "." and self.at_marker(pos):
            raise self.error("'...' ends a document that never started", pos)
        where = "line"
        if text.startswith("---", pos) and self.at_marker(pos):
            pos, where = self.skip_spaces(pos + 3), "doc"
            if text[pos] in "#\n\0":
                pos, where = self.skip_void(pos), "line"
        data = None
        if self.level(pos) >= 0:
            self.positions[()] = self.mark(pos)
            try:
                data, pos = self.node(pos, -1, (), where)
            except RecursionError:   # MAX_NESTING keeps well below the limit; a caller deep in its own stack may not
                raise self.error("nested too deeply for Python's recursion limit", self.opened) from None
        ended = False
        while text[pos] == "." and self.at_marker(pos):
            ended, pos = True, self.end_of_line(pos + 3)
        if pos < self.end:
            if ended or self.at_marker(pos):
                raise self.error("multiple documents are not supported", pos)
            raise self.error("unexpected content after the document; check the indentation", pos)
        return data, self.positions

    def node(self, pos, parent_indent, path, where):
        """A node in block context.  ``where`` is "line" (own line), "dash"
        (after "- "), "key" (after "key: ") or "doc" (after "--- ")."""
        text = self.text
        char = text[pos]
        if self.is_entry(pos):
            if where in ("key", "doc"):
                raise self.error("sequence entries are not allowed here", pos)
            return self.block_sequence(pos, self.column(pos), path, indentless=False)
        if char in "|>":
            return self.block_scalar(pos, parent_indent)
        if char in "[{":
            value, end = self.flow_collection(pos, path)
            if text[self.skip_spaces(end)] == ":":
                raise self.error("collections as mapping keys are not supported", pos)
            return value, self.end_of_line(end)
        key = self.try_key(pos)
        if key is not None:
            if where in ("key", "doc"):
                raise self.error("mapping values are not allowed here", key[1] - 1)
            return self.block_mapping(pos, self.column(pos), path)
        value, end = self.scalar(pos, parent_indent, flow=False)
        return value, self.end_of_line(end)

    def try_key(self, pos):
        """``(key, position after the colon)`` if an implicit key starts at pos, else None."""
        text = self.text
        if text[pos] in "'\"":
            key, end = self.quoted(pos)
            if "\n" in text[pos:end]:
                return None
        elif self.plain_can_start(pos, flow=False):
            end = _YAML_PLAIN_BLOCK.match(text, pos).end()
            key = None
        else:
            return None
        colon = self.skip_spaces(end)
        if text[colon] != ":" or text[colon + 1] not in _YAML_BLANK:
            return None
        return (self.resolve(text[pos:end], pos) if key is None else key), colon + 1

    def block_mapping(self, pos, indent, path):
        self.nest(pos, path)
        result = {}
        while True:
            key = self.try_key(pos)
            if key is None:
                raise self.not_a_key(pos)
            key, after = key
            if key in result:
                raise self.error("duplicate key %r" % (key,), pos)
            self.positions[path + (key,)] = self.mark(pos)
            result[key], pos = self.mapping_value(after, indent, path + (key,))
            level = self.level(pos)
            if level < indent:
                return result, pos
            if level > indent:
                raise self.error("bad indentation: this mapping's keys are in column %d"
                                 % (indent + 1), pos)

    def not_a_key(self, pos):
        if self.is_entry(pos):
            return self.error("expected a mapping key, found a sequence entry", pos)
        # A scalar that parses is a key missing its colon; otherwise scalar() says what is wrong.
        _, end = self.scalar(pos, self.column(pos), flow=False)
        return self.error("expected ':' after mapping key", end)

    def mapping_value(self, pos, indent, path):
        pos = self.skip_spaces(pos)
        if self.text[pos] not in "#\n\0":
            return self.node(pos, indent, path, "key")
        pos = self.skip_void(pos)
        if self.owns_next_line(pos, indent):
            return self.node(pos, indent, path, "line")
        if self.level(pos) == indent and self.is_entry(pos):   # "key:\n- item", as PyYAML allows
            return self.block_sequence(pos, indent, path, indentless=True)
        return None, pos

    def owns_next_line(self, pos, indent):
        """Whether the node at pos is the value of an entry (of the collection at
        ``indent``) that has nothing after its ":" or "-"."""
        level = self.level(pos)
        # PyYAML also takes a block scalar header in the collection's own column.
        return level > indent or (level == indent and self.text[pos] in "|>")

    def block_sequence(self, pos, indent, path, indentless):
        self.nest(pos, path)
        text = self.text
        items = []
        while True:
            item_path = path + (len(items),)
            dash, start = pos, self.skip_spaces(pos + 1)
            if text[start] not in "#\n\0":
                self.positions[item_path] = self.mark(start)
                value, pos = self.node(start, indent, item_path, "dash")
            else:
                pos = self.skip_void(start)
                if self.owns_next_line(pos, indent):
                    self.positions[item_path] = self.mark(pos)
                    value, pos = self.node(pos, indent, item_path, "line")
                else:   # an empty entry; PyYAML places it just after the dash
                    self.positions[item_path] = self.mark(dash + 1)
                    value = None
            items.append(value)
            level = self.level(pos)
            if level < indent:
                return items, pos
            if level > indent:
                raise self.error("bad indentation: this sequence's entries are in column %d"
                                 % (indent + 1), pos)
            if not self.is_entry(pos):
                if indentless:
                    return items, pos
                raise self.error("expected '- ' (a sequence entry) in this column", pos)

    def block_scalar(self, pos, parent_indent):
        """A "|" or ">" scalar; PyYAML's rules for indentation, folding and chomping."""
        text = self.text
        folded, chomp, increment = text[pos] == ">", "", None
        pos += 1
        for _ in range(2):
            if text[pos] in "+-" and not chomp:
                chomp, pos = text[pos], pos + 1
            elif text[pos] in "123456789" and increment is None:
                increment, pos = int(text[pos]), pos + 1
        after = self.skip_spaces(pos)
        if text[after] == "#" and after > pos:
            after = self.line_end(after)
        if text[after] not in "\n\0":
            raise self.error("expected a comment or a line break after the block scalar header"
                             " (indentation indicators are 1-9)", after)
        pos = min(after + 1, self.end)
        min_indent = max(parent_indent + 1, 1)
        if increment:
            indent = min_indent + increment - 1
        else:   # the deepest of the leading blank lines and the first content line
            indent, probe = min_indent, pos
            while True:
                spaces_end = self.skip_spaces(probe)
                indent = max(indent, spaces_end - probe)
                if text[spaces_end] != "\n":
                    break
                probe = spaces_end + 1
        lines, blanks, last_break = [], 0, ""
        while pos < self.end:
            spaces_end = self.skip_spaces(pos)
            width = spaces_end - pos
            if width <= indent and text[spaces_end] in "\n\0":
                if text[spaces_end] == "\0":
                    break
                blanks, pos = blanks + 1, spaces_end + 1
                continue
            if width < indent:
                break
            line_end = self.line_end(pos)
            lines.append((blanks, text[pos + indent:line_end]))
            blanks, last_break = 0, ("\n" if line_end < self.end else "")
            pos = min(line_end + 1, self.end)
        chunks = []
        for number, (before, line) in enumerate(lines):
            if number == 0:
                chunks.append("\n" * before)
            elif folded and lines[number - 1][1][0] not in " \t" and line[0] not in " \t":
                chunks.append("\n" * before if before else " ")
            else:
                chunks.append("\n" * (before + 1))
            chunks.append(line)
        if chomp != "-":
            chunks.append(last_break)
        if chomp == "+":
            chunks.append("\n" * blanks)
        return "".join(chunks), self.skip_void(pos)

    # -- scalars -----------------------------------------------------------------
    def plain_can_start(self, pos, flow):
        char = self.text[pos]
        if char in _YAML_BLANK:
            return False
        if char not in _YAML_INDICATORS:
            return True
        # "-", "?" and ":" start a plain scalar when a non-space follows ("?" and ":"
        # only in block context).
        return (self.text[pos + 1] not in _YAML_BLANK
                and (char == "-" or (not flow and char in "?:")))

    def scalar(self, pos, parent_indent, flow):
        """A quoted or plain scalar; returns (value, end of its text)."""
        text = self.text
        char = text[pos]
        if char in "'\"":
            return self.quoted(pos)
        if char in "&*!" or (char == "?" and (flow or text[pos + 1] in _YAML_BLANK)):
            raise self.error(_YAML_UNSUPPORTED[char], pos)
        if not self.plain_can_start(pos, flow):
            if char == "\t":
                raise self.error(_YAML_TAB, pos)
            if char == ":":
                raise self.error("empty mapping keys are not supported", pos)
            raise self.error("unexpected character %r; quote the value if it is text" % char, pos)
        pattern = _YAML_PLAIN_FLOW if flow else _YAML_PLAIN_BLOCK
        end = pattern.match(text, pos).end()
        chunks = [text[pos:end]]
        while True:
            following = self.continuation(end, parent_indent, flow)
            word = following and pattern.match(text, following[0])
            if not word:
                break
            chunks += ["\n" * following[1] or " ", word.group()]
            end = word.end()
        return self.resolve("".join(chunks), pos), end

    def continuation(self, end, parent_indent, flow):
        """Where a plain scalar continues on a later line: (position, blank lines) or None."""
        text = self.text
        pos = self.skip_spaces(end)
        blanks = -1
        while text[pos] == "\n":
            if self.at_marker(pos + 1):
                return None
            pos, blanks = self.skip_spaces(pos + 1), blanks + 1
        if blanks < 0 or text[pos] in "#\0" or (not flow and self.column(pos) <= parent_indent):
            return None
        return pos, blanks

    def resolve(self, plain, pos):
        if plain in ("<<", "="):
            raise self.error(_YAML_UNSUPPORTED[plain], pos)
        try:
            return _yaml_plain_value(plain)
        except ValueError as exc:
            raise self.error("cannot read %r: %s" % (plain, exc), pos) from None

    def quoted(self, pos):
        """A single- or double-quoted scalar; returns (text, position after the closing quote)."""
        text = self.text
        quote = text[pos]
        run = _YAML_SINGLE_RUN if quote == "'" else _YAML_DOUBLE_RUN
        chunks, i = [], pos + 1
        while True:
            j = run.match(text, i).end()
            chunks.append(text[i:j])
            char = text[j]
            if char == quote and quote == "'" and text[j + 1] == "'":
                chunks.append("'")
                i = j + 2
            elif char == quote:
                return "".join(chunks), j + 1
            elif char == "\n":
                chunks[-1] = chunks[-1].rstrip(" \t")
                i, blanks = self.quoted_breaks(j, pos)
                chunks.append("\n" * blanks or " ")
            elif char == "\\":
                i = self.escape(j, pos, chunks)
            else:
                raise self.error("unclosed quoted string: the closing %s is missing" % quote, pos)

    def quoted_breaks(self, pos, start):
        """Skip a line break and what follows inside quotes: (resume position, blank lines)."""
        text, blanks = self.text, 0
        while True:
            pos += 1
            if self.at_marker(pos):
                raise self.error("unclosed quoted string: a document marker is inside it", start)
            while text[pos] in " \t":
                pos += 1
            if text[pos] != "\n":
                return pos, blanks
            blanks += 1

    def escape(self, pos, start, chunks):
        text = self.text
        char = text[pos + 1]
        if char in _YAML_ESCAPES:
            chunks.append(_YAML_ESCAPES[char])
            return pos + 2
        if char == "\n":   # an escaped line break joins the lines without a space
            resume, blanks = self.quoted_breaks(pos + 1, start)
            chunks.append("\n" * blanks)
            return resume
        width = _YAML_HEX_WIDTH.get(char)
        if width is None:
            raise self.error("unknown escape sequence '\\%s'" % char, pos)
        digits = text[pos + 2:pos + 2 + width]
        if not re.fullmatch("[0-9a-fA-F]{%d}" % width, digits):
            raise self.error("expected %d hexadecimal digits after \\%s" % (width, char), pos)
        if int(digits, 16) > 0x10FFFF:
            raise self.error("\\%s%s is beyond the last Unicode character" % (char, digits), pos)
        chunks.append(chr(int(digits, 16)))
        return pos + 2 + width

    # -- flow collections ------------------------------------------------------
    def flow_collection(self, pos, path):
        """``[...]`` or ``{...}`` at pos; returns (value, position after the closing bracket)."""
        self.nest(pos, path)
        text = self.text
        is_map = text[pos] == "{"
        close = "}" if is_map else "]"
        result = {} if is_map else []
        item = self.flow_void(pos + 1, pos)
        while text[item] != close:
            if is_map:
                end = self.flow_pair(item, pos, result, path)
            else:
                item_path = path + (len(result),)
                self.positions[item_path] = self.mark(item)
                value, end = self.flow_node(item, item_path)
                if text[self.skip_spaces(end)] == ":":   # "[k: v]" holds a one-key mapping
                    self.nest(item, item_path)
                    value = {}
                    end = self.flow_pair(item, pos, value, item_path)
                result.append(value)
            item = self.flow_void(end, pos)
            if text[item] == ",":
                item = self.flow_void(item + 1, pos)
            elif text[item] != close:
                raise self.error("expected ',' or '%s' in the flow collection" % close, item)
        return result, item + 1

    def flow_pair(self, pos, start, mapping, path):
        """Add the ``key[: value]`` at pos to mapping; return the position after it."""
        text = self.text
        if text[pos] in "[{":
            raise self.error("collections as mapping keys are not supported", pos)
        key, end = self.scalar(pos, -1, flow=True)
        if key in mapping:
            raise self.error("duplicate key %r" % (key,), pos)
        self.positions[path + (key,)] = self.mark(pos)
        value, colon = None, self.skip_spaces(end)
        if text[colon] == ":" and "\n" in text[pos:end]:
            raise self.error("a mapping key must be on a single line", colon)
        if text[colon] == ":":
            end = self.flow_void(colon + 1, start)
            if text[end] not in ",]}":
                value, end = self.flow_node(end, path + (key,))
        mapping[key] = value
        return end

    def flow_node(self, pos, path):
        if self.text[pos] in "[{":
            return self.flow_collection(pos, path)
        return self.scalar(pos, -1, flow=True)

    def flow_void(self, pos, start):
        pos = self.skip_void(pos)
        if self.level(pos) < 0:
            raise self.error("unclosed '%s': the closing bracket is missing" % self.text[start],
                             start)
        return pos


# -- writing ------------------------------------------------------------------
# The admin API rewrites config.yaml from data; dump_yaml emits the subset the
# parser above reads (block mappings and sequences, flow lists of scalars,
# double-quoted strings), so what it writes loads back identically either way.

_YAML_PLAIN_SAFE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*\Z")
_YAML_QUOTE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def format_path(path):
    """A key path as config errors name it: ``("models", 0, "name")`` is ``models[0].name``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def dump_yaml(data, header=""):
    """``data`` (dicts, lists, str, int, float, bool, None) as YAML text; ``header`` lines become comments."""
    lines = ["# " + line if line else "#" for line in header.splitlines()]
    if isinstance(data, dict) and data:
        _yaml_emit_mapping(data, 0, lines)
    else:
        lines.append(_yaml_flow(data))
    return "\n".join(lines) + "\n"


def _yaml_emit_mapping(mapping, indent, lines):
    pad = " " * indent
    for key, value in mapping.items():
        head = pad + _yaml_scalar(str(key)) + ":"
        if isinstance(value, dict) and value:
            lines.append(head)
            _yaml_emit_mapping(value, indent + 2, lines)
        elif isinstance(value, list) and value and not _yaml_is_flat(value):
            lines.append(head)
            _yaml_emit_sequence(value, indent + 2, lines)
        else:
            lines.append(head + " " + _yaml_flow(value))


def _yaml_emit_sequence(items, indent, lines):
    pad = " " * indent
    for item in items:
        if isinstance(item, dict) and item:
            nested = []
            _yaml_emit_mapping(item, indent + 2, nested)
            lines.append(pad + "- " + nested[0][indent + 2:])
            lines.extend(nested[1:])
        elif isinstance(item, list) and item and not _yaml_is_flat(item):
            lines.append(pad + "-")
            _yaml_emit_sequence(item, indent + 2, lines)
        else:
            lines.append(pad + "- " + _yaml_flow(item))


def _yaml_is_flat(items):
    return all(not isinstance(item, (dict, list)) for item in items)


def _yaml_flow(value):
    if isinstance(value, dict):
        return "{" + ", ".join(_yaml_scalar(str(k)) + ": " + _yaml_flow(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_flow(v) for v in value) + "]"
    return _yaml_scalar(value)


def _yaml_scalar(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        return text if "." in text or "e" not in text else text.replace("e", ".0e", 1)
    text = str(value)
    if _YAML_PLAIN_SAFE.match(text) and text not in _YAML_BOOLS and text not in _YAML_NULLS \
            and not _YAML_INT.fullmatch(text) and not _YAML_FLOAT.fullmatch(text) and text not in ("y", "n"):
        return text
    out = []
    for char in text:
        if char in _YAML_QUOTE_ESCAPES:
            out.append(_YAML_QUOTE_ESCAPES[char])
        elif _YAML_BAD_CHARACTER.match(char):
            code = ord(char)
            out.append("\\x%02x" % code if code < 0x100 else "\\u%04x" % code if code < 0x10000 else "\\U%08x" % code)
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
