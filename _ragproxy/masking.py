"""Secrets in what the admin API shows: mask_secret, mask_text, and restore_text for what comes back.

The secrets are the clients' ``api_keys``, the providers' ``api_key`` and
those of their extra ``headers`` whose names say they carry a credential
(Authorization, X-Api-Key, Cookie, ...), the Chroma server's ``token`` and
the compression state's ``redis_url`` (which may hold a password).  mask_secret shows enough of one to
recognise it (``sk-••••wxyz``), not to use it; an ``${VAR}`` reference is no
secret and is shown as written.

mask_text masks them in config.yaml's text in place, so the editor keeps the
file's lines and comments; restore_text, given the text the editor sends
back and the file as stored, puts the stored value back wherever a masked one
came back unchanged, before the text is validated and written.  A masked
value that matches no stored secret (its key was renamed and edited, or the
file changed meanwhile) is an error, never saved as a key.

May import: yamlish.
"""
from __future__ import annotations

import re

from .yamlish import YAMLError, dump_yaml, format_path, load_yaml

MASK_CHAR = "\u2022"
_SECRET_HEADER = re.compile(r"auth|key|token|secret|passw|cookie|session|credential|signature", re.I)
# What yamlish (and YAML) will not take raw inside double quotes, written as escapes instead.
_NOT_RAW = re.compile("[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\"\\\\]")
_REFORMATTED = ("Shown re-formatted, without its comments: a key in this file is written in a form\n"
                "(across lines, for one) that cannot be masked in place.  Saving replaces the file.")


class MaskError(ValueError):
    """Masked values that match no stored secret; ``errors`` lists ``(key path, line, message)``."""

    def __init__(self, errors):
        self.errors = list(errors)
        super().__init__("; ".join(message for _, _, message in self.errors))


def mask_secret(value):
    """What the admin API shows of a stored secret: enough to recognise it, not to use it."""
    if not value:
        return ""
    if "${" in value:
        return value  # an environment reference, not the secret itself
    if len(value) <= 8:
        return MASK_CHAR * 8
    return value[:3] + MASK_CHAR * 4 + value[-4:]


def is_secret_header(name):
    """True for an extra header whose value is a credential (by its name)."""
    return bool(_SECRET_HEADER.search(str(name)))


def restore(submitted, stored):
    """``stored`` where ``submitted`` is its mask sent back unchanged, else ``submitted``."""
    if isinstance(submitted, str) and isinstance(stored, str) and stored and submitted != stored \
            and submitted == mask_secret(stored):
        return stored
    return submitted


def secret_paths(data):
    """``[(key path, value)]`` of every secret string in a config's data as written."""
    found = []
    if not isinstance(data, dict):
        return found
    keys = data.get("api_keys")
    for i, item in enumerate(keys if isinstance(keys, list) else []):
        if isinstance(item, str):
            found.append((("api_keys", i), item))
        elif isinstance(item, dict) and isinstance(item.get("key"), str):
            found.append((("api_keys", i, "key"), item["key"]))
    providers = data.get("providers")
    for kind, named in (providers.items() if isinstance(providers, dict) else ()):
        for name, spec in (named.items() if isinstance(named, dict) else ()):
            if not isinstance(spec, dict):
                continue
            if isinstance(spec.get("api_key"), str):
                found.append((("providers", kind, name, "api_key"), spec["api_key"]))
            headers = spec.get("headers")
            for header, value in (headers.items() if isinstance(headers, dict) else ()):
                if isinstance(value, str) and is_secret_header(header):
                    found.append((("providers", kind, name, "headers", header), value))
    store = data.get("vectorstore")
    chroma = store.get("chroma_http") if isinstance(store, dict) else None
    if isinstance(chroma, dict) and isinstance(chroma.get("token"), str):
        found.append((("vectorstore", "chroma_http", "token"), chroma["token"]))
    compression = data.get("compression")
    state = compression.get("state") if isinstance(compression, dict) else None
    if isinstance(state, dict) and isinstance(state.get("redis_url"), str):  # it may carry a password
        found.append((("compression", "state", "redis_url"), state["redis_url"]))
    return [(path, value) for path, value in found if value]


def mask_text(text):
    """config.yaml's ``text`` with every secret masked in place; lines and comments are kept.

    Raises YAMLError if the text does not parse: its secrets cannot be found then.
    """
    data, positions = load_yaml(text)
    secrets = [(path, mask_secret(value)) for path, value in secret_paths(data)]
    secrets = [(path, mask) for path, mask in secrets if mask != _value_at(data, path)]
    if not secrets:
        return text
    masked = _replace_values(text, data, positions, secrets)
    if masked is not None:
        return masked
    return dump_yaml(_with_values(data, secrets), header=_REFORMATTED)


def restore_text(text, stored_text):
    """``text`` from the editor with each masked secret replaced by the stored one it masks.

    A masked value is matched by its key path in ``stored_text`` (the file as
    it is), else by being the mask of exactly one stored secret.  Raises
    MaskError for a masked value that matches none.  Text that does not parse
    is returned as it is, for validation to report where.
    """
    try:
        data, positions = load_yaml(text)
    except YAMLError:
        return text
    stored = {}
    try:
        stored = dict(secret_paths(load_yaml(stored_text)[0])) if stored_text is not None else {}
    except YAMLError:
        pass
    replacements, errors = [], []
    for path, value in secret_paths(data):
        if MASK_CHAR * 4 not in value:
            continue
        real = restore(value, stored.get(path))
        if real == value:
            matches = {v for v in stored.values() if restore(value, v) != value}
            if len(matches) == 1:
                real = matches.pop()
        if real != value:
            replacements.append((path, real))
            continue
        line = positions.get(path, (None,))[0]
        errors.append((format_path(path), line, "this is a masked key that matches no stored key "
                       "(was it renamed, or changed in the file meanwhile?): type the key itself"))
    if errors:
        raise MaskError(errors)
    if not replacements:
        return text
    restored = _replace_values(text, data, positions, replacements)
    if restored is None:   # cannot happen for text mask_text wrote; a hand-made edit, perhaps
        return dump_yaml(_with_values(data, replacements), header="")
    return restored


# -- in place -----------------------------------------------------------------


def _value_at(data, path):
    for part in path:
        data = data[part]
    return data


def _with_values(data, replacements):
    """A copy of ``data`` with the values at the given paths replaced."""
    def copy(node):
        if isinstance(node, dict):
            return {k: copy(v) for k, v in node.items()}
        return [copy(v) for v in node] if isinstance(node, list) else node

    data = copy(data)
    for path, value in replacements:
        parent = _value_at(data, path[:-1])
        parent[path[-1]] = value
    return data


def _replace_values(text, data, positions, replacements):
    """``text`` with the scalars at the given key paths rewritten to the given strings, each in its
    own quoting style where that holds it; None if one cannot be found on its line or the result
    would not load back as ``data`` with exactly those values changed."""
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    spans = []
    for path, _ in replacements:
        span = _scalar_span(text, line_starts, positions.get(path), path, _value_at(data, path))
        if span is None:
            return None
        spans.append(span)
    expected = _with_values(data, replacements)
    for styles in (None, '"'):   # as written first; double quotes hold any string
        out = text
        for (start, end, style), (_, value) in sorted(zip(spans, replacements), key=lambda s: -s[0][0]):
            out = out[:start] + _scalar(value, styles or style) + out[end:]
        try:
            if load_yaml(out)[0] == expected:
                return out
        except YAMLError:
            pass
    return None


def _scalar_span(text, line_starts, position, path, value):
    """``(start, end, style)`` of the one-line scalar ``value`` whose key (or list item) is at ``position``."""
    if position is None or not 0 < position[0] <= len(line_starts):
        return None
    at = line_starts[position[0] - 1] + position[1] - 1
    if isinstance(path[-1], str):   # positions give a mapping entry's key: skip it and the colon
        key_end = _quoted_end(text, at) if text[at:at + 1] in ("'", '"') else \
            at + len(path[-1]) if text.startswith(path[-1], at) else None
        if key_end is None:
            return None
        at = key_end
        while text[at:at + 1] in (" ", "\t"):
            at += 1
        if text[at:at + 1] != ":":
            return None
        at += 1
        while text[at:at + 1] in (" ", "\t"):
            at += 1
    first = text[at:at + 1]
    if first in ("'", '"'):
        end = _quoted_end(text, at)
        return None if end is None else (at, end, first)
    return (at, at + len(value), "") if value and text.startswith(value, at) else None


def _quoted_end(text, start):
    """Where the quoted scalar opening at ``start`` ends (after its closing quote); None if it
    continues on another line."""
    quote, i = text[start], start + 1
    while i < len(text):
        char = text[i]
        if char == "\n":
            return None
        if quote == '"' and char == "\\":
            i += 2
            continue
        if char == quote:
            if quote == "'" and text[i + 1:i + 2] == "'":
                i += 2
                continue
            return i + 1
        i += 1
    return None


def _scalar(value, style):
    if style == "'":
        return "'" + value.replace("'", "''") + "'"
    if style == '"':
        return '"' + _NOT_RAW.sub(_escape, value) + '"'
    return value


def _escape(match):
    char = match.group()
    if char in '"\\':
        return "\\" + char
    code = ord(char)
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code if code < 0x10000 else "\\U%08x" % code
