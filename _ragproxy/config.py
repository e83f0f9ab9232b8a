"""The configuration: validation, Config and its parts.

config.yaml is validated against the declarative schema (``schema``): every
key path is known, so a typo is an error with its line number instead of a
silently ignored setting.  Precedence is CLI > environment > file > defaults.
The file on disk (the default one, validated writes, reloads) is
``configfile``'s.  Also owns the knowledge-base naming rule (KB_NAME), since
names become paths, and what an api_keys entry may read (key_allows_kb,
key_allows_model, key_scope).

May import: guard, redact, schema, yamlish.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import math
import os
import re
import urllib.parse

from .guard import Guard
from .redact import CATEGORIES as REDACT_CATEGORIES
from .schema import (
    COMPRESSION_CHOICES,
    DEFAULT_LEVERS,
    GUARDRAILS_SCHEMA,
    KB_SCHEMA,
    LEVER_SCHEMAS,
    REQUIRED,
    SCHEMA,
    Field,
)
from .yamlish import YAMLError, format_path, load_yaml

log = logging.getLogger("ragproxy")


class ConfigError(ValueError):
    """An invalid configuration; ``errors`` lists ``(key_path, line, message)`` in file order.

    The checks find problems in schema order, then the cross-field ones;
    someone fixing a file reads it top to bottom, so the errors are sorted by
    line (stable: one line's errors keep their order; those with no line last).
    """

    def __init__(self, errors, source="config"):
        self.errors = sorted(errors, key=lambda error: (error[1] is None, error[1] or 0))
        self.source = source
        lines = []
        for path, line, message in self.errors:
            where = f"{source}:{line}: " if line else f"{source}: "
            lines.append(f"{where}{path or '(top level)'}: {message}" if path else f"{where}{message}")
        super().__init__("\n".join(lines))


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")

# Knowledge-base names become directory names: no separators, no dot-only names.
KB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def valid_kb_name(name):
    return isinstance(name, str) and bool(KB_NAME.match(name))


_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute_env(value, environ, path, errors, positions):
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string; ``$$`` is a literal ``$``."""
    if isinstance(value, dict):
        return {k: _substitute_env(v, environ, path + (k,), errors, positions) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute_env(v, environ, path + (i,), errors, positions) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def replace(m):
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        errors.append((format_path(path), _line_of(positions, path),
                       f"environment variable {name} is not set (use ${{{name}:-default}})"))
        return ""

    return _ENV_REF.sub(replace, value)


def _line_of(positions, path):
    while path:
        if path in positions:
            return positions[path][0]
        path = path[:-1]
    return None


def _check_field(value, field, path, positions, errors):
    def bad(message):
        errors.append((format_path(path), _line_of(positions, path), message))
        return field.default if field.default is not REQUIRED else None

    if value is None and field.null:
        return copy_default(field.default)
    kind = field.kind
    if kind in ("str", "url"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # `port: "8100"`-style slips are harmless for strings
        if not isinstance(value, str):
            return bad(f"expected a string, got {type(value).__name__}")
        if kind == "url":
            parsed = urllib.parse.urlsplit(value)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                return bad(f"expected an http:// or https:// URL, got {value!r}")
            value = value.rstrip("/")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return bad(f"expected an integer, got {value!r}")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return bad(f"expected a number, got {value!r}")
        value = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            return bad(f"expected true or false, got {value!r}")
    elif kind == "file":
        if not isinstance(value, str):
            return bad(f"expected a file path, got {type(value).__name__}")
        value = os.path.expanduser(value)
        if value and not os.path.isabs(value):  # ragproxy's working directory is nobody's intent
            return bad(f"expected an absolute path, got {value!r}")
        if value and not os.path.isfile(value):
            return bad(f"no such file: {value}")
    elif kind == "str_list":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return bad("expected a string or a list of strings")
    elif kind == "map_str":
        if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) for v in value.values()):
            return bad("expected a mapping of names to strings")
        value = {str(k): str(v) for k, v in value.items()}
    elif kind == "key_list":
        return _check_api_keys(value, path, positions, errors)
    elif kind == "guardrails":
        return _check_model_guardrails(value, path, positions, errors)
    elif kind == "levers":
        return _check_levers(value, path, positions, errors)
    elif kind == "compression_choice":
        if isinstance(value, bool):
            return "on" if value else "off"
        if not isinstance(value, str):
            return bad(f"expected on, off or a compression.profiles name, got {value!r}")
    if field.choices and value not in field.choices:
        return bad(f"expected one of {', '.join(field.choices)}, got {value!r}")
    if field.minimum is not None and value < field.minimum:
        return bad(f"must be at least {field.minimum}, got {value!r}")
    return value


#: The fields of an api_keys mapping as config.yaml spells them.
API_KEY_FIELDS = ("key", "name", "kbs", "models")


def _check_api_keys(value, path, positions, errors):
    """api_keys entries: plain strings (every KB and model) or ``{key, name, kbs, models}`` maps.

    Each comes out as ``{"key", "name", "kbs": "*" | [names], "models": [globs], "explicit"}``;
    a mapping without ``kbs`` or ``models`` gets every one ("*"), and ``explicit`` says
    it named both (what security.require_acl asks of every key).
    """
    keys = []
    if value is None:
        return keys
    if not isinstance(value, list):
        errors.append((format_path(path), _line_of(positions, path), "expected a list of keys"))
        return keys
    seen_keys, seen_names = {}, {}
    for i, item in enumerate(value):
        where = path + (i,)

        def bad(message, at=where):
            errors.append((format_path(at), _line_of(positions, at), message))

        if isinstance(item, str):
            entry = {"key": item, "name": "", "kbs": "*", "models": ["*"], "explicit": False}
        elif isinstance(item, dict) and isinstance(item.get("key"), str):
            entry = _check_key_mapping(item, where, positions, errors)
            if entry is None:
                continue
        else:
            bad("expected a key string or a {key, name, kbs, models} mapping")
            continue
        if len(entry["key"]) < 8:
            bad("an API key must be at least 8 characters")
            continue
        entry["name"] = entry["name"] or f"key{i + 1}"
        # The same key twice would leave its scope to the order of the list, and two keys
        # of one name could not be told apart in the request log (nor edited by name).
        if entry["key"] in seen_keys:
            bad(f"the same key as api_keys[{seen_keys[entry['key']]}]: each key must be different")
            continue
        if entry["name"] in seen_names:
            bad(f"name {entry['name']!r} is already used by api_keys[{seen_names[entry['name']]}]",
                where + ("name",) if isinstance(item, dict) and "name" in item else where)
            continue
        seen_keys[entry["key"]], seen_names[entry["name"]] = i, i
        keys.append(entry)
    return keys


def _check_key_mapping(item, where, positions, errors):
    """One ``{key, name, kbs, models}`` api_keys mapping, normalised; None if it is invalid."""
    ok = True
    for field in item:
        if field not in API_KEY_FIELDS:
            hint = _close_match(field, API_KEY_FIELDS)
            errors.append((format_path(where + (field,)), _line_of(positions, where + (field,)),
                           "unknown key" + (f" (did you mean {hint!r}?)" if hint else "")
                           + f"; an api_keys mapping has {', '.join(API_KEY_FIELDS)}"))
            ok = False
    kbs = _scope_list(item.get("kbs", "*"), "knowledge base names", where + ("kbs",), positions, errors)
    models = _scope_list(item.get("models", "*"), "model names or globs", where + ("models",), positions, errors)
    if kbs is None or models is None:
        return None
    for j, name in enumerate(kbs if kbs != "*" else ()):
        if not valid_kb_name(name):
            at = where + ("kbs", j) if isinstance(item.get("kbs"), list) else where + ("kbs",)
            errors.append((format_path(at), _line_of(positions, at),
                           f"{name!r} is not a knowledge base name: letters, digits, '_', '-' and '.' "
                           "(64 at most, starting with a letter or digit)"))
            ok = False
    if not ok:
        return None
    name = item.get("name")
    return {"key": item["key"], "name": "" if name is None else str(name), "kbs": kbs,
            "models": ["*"] if models == "*" else models,
            "explicit": "kbs" in item and "models" in item}


def _scope_list(value, what, path, positions, errors):
    """A scope as written: ``"*"``, one name or a list of names; ``"*"`` or a list, None if invalid."""
    if value == "*" or value == ["*"]:
        return "*"
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(dict.fromkeys(value))
    errors.append((format_path(path), _line_of(positions, path), f'expected "*" or a list of {what}'))
    return None


def key_allows_kb(entry, name):
    """Whether the api_keys ``entry`` (None: api_key_auth is off) may read knowledge base ``name``."""
    return entry is None or entry["kbs"] == "*" or name in entry["kbs"]


def key_allows_model(entry, model):
    """Whether the api_keys ``entry`` (None: api_key_auth is off) may use ``model``."""
    return entry is None or any(glob == "*" or fnmatch.fnmatchcase(model, glob) for glob in entry["models"])


def key_scope(entry):
    """What an entry may read, as a cache key: ``"*"`` or the sorted KB names."""
    if entry is None or entry["kbs"] == "*":
        return "*"
    return tuple(sorted(entry["kbs"]))


def _check_model_guardrails(value, path, positions, errors):
    """A model's ``guardrails``: the global section's keys, checked the same way; only
    those it sets are kept (merge_guardrails lays them over the global ones)."""
    if not isinstance(value, dict):
        errors.append((format_path(path), _line_of(positions, path), "expected a mapping"))
        return {}
    checked = _check(value, GUARDRAILS_SCHEMA, path, positions, errors)

    def given(checked, written):
        # A section left empty (``redact:``) sets nothing, rather than every default.
        return {k: given(checked[k], written[k] or {}) if isinstance(checked[k], dict)
                and isinstance(written[k] or {}, dict) else checked[k] for k in written if k in checked}

    kept = given(checked, value)
    _check_guardrails(kept, path, positions, errors)
    if (kept.get("redact") or {}).get("at") == "index":
        where = path + ("redact", "at")
        errors.append((format_path(where), _line_of(positions, where),
                       "at: index redacts what is stored, which every model shares: set it under the global "
                       "guardrails.redact, not per model"))
    return kept


def _check_guardrails(section, path, positions, errors):
    """What the schema cannot say about a guardrails section (global, or a model's part of one)."""
    poisoning = section.get("context_poisoning") or {}
    if isinstance(poisoning.get("min_confidence"), float) and poisoning["min_confidence"] > 1:
        where = path + ("context_poisoning", "min_confidence")
        errors.append((format_path(where), _line_of(positions, where),
                       f"a confidence is between 0 and 1, got {poisoning['min_confidence']!r}"))
    categories = (section.get("redact") or {}).get("categories")
    for j, name in enumerate(categories or ()):
        if name not in REDACT_CATEGORIES:
            where = path + ("redact", "categories", j)
            hint = _close_match(name, REDACT_CATEGORIES)
            errors.append((format_path(where), _line_of(positions, where) or _line_of(positions, where[:-1]),
                           f"unknown redaction category {name!r}" + (f" (did you mean {hint!r}?)" if hint else "")
                           + f"; the categories are {', '.join(REDACT_CATEGORIES)}"))
    for j, pattern in enumerate(section.get("deny_patterns") or ()):
        try:
            re.compile(pattern)
            Guard(deny_patterns=(pattern,))   # the guard may refuse more than re does
        except (re.error, ValueError) as exc:
            where = path + ("deny_patterns", j)
            errors.append((format_path(where), _line_of(positions, where) or _line_of(positions, where[:-1]),
                           f"{pattern!r} is not a valid regular expression: {exc}" if isinstance(exc, re.error)
                           else str(exc)))


def _check_levers(value, path, positions, errors):
    """A compression levers list: names (every parameter at its default) or ``{name, params...}``
    mappings, each lever at most once; ``[{"name", params...}]`` in declared order."""
    if value is None:
        return []
    if not isinstance(value, list):
        errors.append((format_path(path), _line_of(positions, path), "expected a list of levers"))
        return []
    out, seen = [], {}
    for i, item in enumerate(value):
        where = path + (i,)
        name = item if isinstance(item, str) else item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            errors.append((format_path(where), _line_of(positions, where),
                           "expected a lever name or a mapping with its name: " + ", ".join(LEVER_SCHEMAS)))
            continue
        if name not in LEVER_SCHEMAS:
            at = where + ("name",) if isinstance(item, dict) else where
            hint = _close_match(name, LEVER_SCHEMAS)
            errors.append((format_path(at), _line_of(positions, at), f"unknown lever {name!r}"
                           + (f" (did you mean {hint!r}?)" if hint else "")
                           + f"; the levers are {', '.join(LEVER_SCHEMAS)}"))
            continue
        if name in seen:
            errors.append((format_path(where), _line_of(positions, where),
                           f"lever {name} is already at {format_path(path + (seen[name],))}: each lever runs once"))
            continue
        seen[name] = i
        params = {k: v for k, v in item.items() if k != "name"} if isinstance(item, dict) else {}
        checked = _check(params, LEVER_SCHEMAS[name], where, positions, errors)
        percent = checked.get("min_relevance_percent")
        if isinstance(percent, float) and not percent <= 100:
            at = where + ("min_relevance_percent",)
            errors.append((format_path(at), _line_of(positions, at), f"a percentage is at most 100, got {percent!r}"))
        out.append({"name": name, **checked})
    return out


def _check_compression(raw, positions, errors):
    """compression: what the schema cannot say (profile names, the summarizer's provider, the
    state backend's address), and each model's ``compression`` choice."""
    section = raw["compression"]
    if section["levers"] is None:
        section["levers"] = _check_levers(list(DEFAULT_LEVERS), ("compression", "levers"), positions, errors)
    profiles = section["profiles"]
    llm = raw["providers"]["llm"]
    lists = [(("compression", "levers"), section["levers"])]
    for name, profile in profiles.items():
        where = ("compression", "profiles", name)
        if name in COMPRESSION_CHOICES or not _PROFILE_NAME.match(name):
            errors.append((format_path(where), _line_of(positions, where),
                           "a profile name uses letters, digits, '_', '-' and '.' (64 at most, starting with a "
                           "letter or digit) and is not on or off" if name not in COMPRESSION_CHOICES else
                           f"{name} is not a profile name: on is compression.levers, off is no levers"))
        if isinstance(profile, dict):
            lists.append((where + ("levers",), profile.get("levers") or []))
    for path, levers in lists:
        for i, lever in enumerate(levers):
            if lever["name"] != "summary_buffer":
                continue
            where = path + (i, "summarizer", "provider")
            provider = lever["summarizer"].get("provider")
            if isinstance(provider, str) and provider not in llm:
                errors.append((format_path(where), _line_of(positions, where),
                               f"no provider {provider!r} under providers.llm"
                               + (f" (have: {', '.join(llm)})" if llm else "")))
            elif isinstance(provider, str) and isinstance(llm[provider], dict) \
                    and llm[provider].get("type") == "anthropic":
                errors.append((format_path(where), _line_of(positions, where),
                               f"the summarizer is asked through /v1/chat/completions: provider {provider!r} is "
                               "type anthropic; name an openai or ollama provider"))
    state = section["state"]
    url = state["redis_url"] or ""
    if url and not urllib.parse.urlsplit(url).scheme == "redis":
        where = ("compression", "state", "redis_url")
        errors.append((format_path(where), _line_of(positions, where),
                       "expected a redis://[:password@]host[:port][/db] URL"))   # never the value: a secret
    elif state["backend"] == "redis" and not url:
        where = ("compression", "state", "backend")
        errors.append((format_path(where), _line_of(positions, where),
                       "backend redis needs compression.state.redis_url (redis://host:6379/0)"))
    for i, model in enumerate(raw["models"]):
        choice = model.get("compression") if isinstance(model, dict) else None
        if isinstance(choice, str) and choice not in COMPRESSION_CHOICES and choice not in profiles:
            where = ("models", i, "compression")
            hint = _close_match(choice, list(COMPRESSION_CHOICES) + list(profiles))
            errors.append((format_path(where), _line_of(positions, where),
                           f"expected on, off or a compression.profiles name, got {choice!r}"
                           + (f" (did you mean {hint!r}?)" if hint else "")
                           + (f"; the profiles are {', '.join(profiles)}" if profiles else "")))


def merge_guardrails(base, override):
    """The guardrails in effect for a model: ``override``'s keys (a model's, as checked) over ``base``."""
    merged = copy_default(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **copy_default(value)}
        else:
            merged[key] = copy_default(value)
    return merged


def _check(value, schema, path, positions, errors):
    """Validate ``value`` against ``schema``; returns the value with defaults filled in."""
    if isinstance(schema, Field):
        return _check_field(value, schema, path, positions, errors)
    if isinstance(schema, tuple):  # ("list", item_schema) or ("named", item_schema)
        container, item_schema = schema
        if value is None:
            value = [] if container == "list" else {}
        if container == "list":
            if not isinstance(value, list):
                errors.append((format_path(path), _line_of(positions, path), "expected a list"))
                return []
            return [_check(v, item_schema, path + (i,), positions, errors) for i, v in enumerate(value)]
        if not isinstance(value, dict):
            errors.append((format_path(path), _line_of(positions, path), "expected a mapping"))
            return {}
        return {str(k): _check(v, item_schema, path + (k,), positions, errors) for k, v in value.items()}
    if value is None:
        value = {}
    if not isinstance(value, dict):
        errors.append((format_path(path), _line_of(positions, path), "expected a mapping"))
        value = {}
    out = {}
    for key in value:
        if key not in schema:
            hint = _close_match(key, schema)
            errors.append((format_path(path + (key,)), _line_of(positions, path + (key,)),
                           "unknown key" + (f" (did you mean {hint!r}?)" if hint else "")))
    for key, sub in schema.items():
        if key in value:
            out[key] = _check(value[key], sub, path + (key,), positions, errors)
        elif isinstance(sub, Field) and sub.default is REQUIRED:
            errors.append((format_path(path + (key,)), _line_of(positions, path), "required key is missing"))
        elif isinstance(sub, Field):
            out[key] = copy_default(sub.default)
        else:
            out[key] = _check(None, sub, path + (key,), positions, errors)
    return out


def _close_match(word, choices):
    import difflib   # here: only a config with a typo pays for it

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return close[0] if close else None


def copy_default(value):
    return json.loads(json.dumps(value)) if isinstance(value, (dict, list)) else value


@dataclasses.dataclass(frozen=True)
class Provider:
    """An upstream server of one kind (llm, embedding or rerank)."""

    name: str
    type: str
    base_url: str
    api_key: str = ""
    headers: tuple = ()
    model: str = ""
    pass_client_key: bool = False
    ca_file: str = ""
    tls_verify: bool = True
    client_cert: str = ""
    client_key: str = ""
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    batch_size: int = 64       # embedding providers: texts per request
    max_concurrency: int = 2   # embedding providers: requests in flight

    @property
    def tls(self):
        """``(ca_file, verify, client_cert, client_key)``: how the upstream client talks to an
        https base_url."""
        return self.ca_file, self.tls_verify, self.client_cert, self.client_key


_PROVIDER_FIELDS = frozenset(f.name for f in dataclasses.fields(Provider)) - {"name", "headers"}


@dataclasses.dataclass(frozen=True)
class ModelRoute:
    """One ``models`` entry: which provider(s) serve the names matching ``name``."""

    name: str
    upstream: tuple
    upstream_model: str = ""
    kb: tuple = ()
    kb_merge: str = "concat"
    inject_mode: str = "before_last_user"
    rerank: bool = False
    on_failure: str = ""
    timeout_ms: int = 0   # 0: rag.timeout_ms
    max_input_tokens: int = 0   # 0: no limit
    compression: str = "off"    # on, off or a compression.profiles name
    context_window: int = None  # tokens; None: window.KNOWN_WINDOWS by the upstream model's name
    # The guardrails in effect for this model (the global ones with its own over them).
    guardrails: dict = dataclasses.field(default=None, hash=False)

    @property
    def is_glob(self):
        name = self.name
        return "*" in name or "?" in name or "[" in name


class Config:
    """A validated configuration.  ``raw`` is the full dict with defaults filled in.

    ``knowledge_bases`` is every KB the proxy serves: those declared under
    ``knowledge_bases:`` (``raw`` has only these) and those that ``models[].kb``
    names without declaring (``undeclared_kbs``: name -> (key path, line, the
    declared name it is close to)), which get the default settings.
    ``warnings`` lists ``(key path, line, message)`` for what works, but not as
    written; ``load`` logs them.
    """

    def __init__(self, raw, path=None, warnings=(), positions=None):
        self.raw = raw
        self.path = path
        self.warnings = tuple(warnings)
        self.server = raw["server"]
        self.rag = raw["rag"]
        self.api_key_auth = raw["api_key_auth"]
        self.api_keys = raw["api_keys"]
        self.providers = {
            kind: {name: Provider(name=name, headers=tuple(sorted(spec["headers"].items())),
                                  **{k: v for k, v in spec.items() if k in _PROVIDER_FIELDS})
                   for name, spec in raw["providers"][kind].items()}
            for kind in ("llm", "embedding", "rerank")
        }
        self.guardrails = raw["guardrails"]
        self.models = [ModelRoute(**{**m, "upstream": tuple(m["upstream"]), "kb": tuple(m["kb"]),
                                     "guardrails": merge_guardrails(self.guardrails, m.get("guardrails"))})
                       for m in raw["models"]]
        self.undeclared_kbs = _undeclared_kbs(raw, positions or {})
        self.knowledge_bases = {**raw["knowledge_bases"],
                                **{name: default_kb_settings() for name in self.undeclared_kbs}}

    @classmethod
    def from_text(cls, text, source="config.yaml", environ=None, overrides=None):
        """Parse, substitute ``${VAR}``, validate; raise ConfigError naming every problem."""
        data, positions = parse_config_text(text, source)
        errors, warnings = [], []
        data = _substitute_env(data, os.environ if environ is None else environ, (), errors, positions)
        for dotted, value in (overrides or {}).items():
            section, key = dotted.split(".")
            if isinstance(data, dict) and value is not None:
                data.setdefault(section, {})
                if isinstance(data[section], dict):
                    data[section][key] = value
        raw = _check(data, SCHEMA, (), positions, errors)
        _check_semantics(raw, positions, errors, warnings)
        _check_key_scopes(data, raw, positions, errors, warnings)
        if errors:
            raise ConfigError(errors, source)
        return cls(raw, path=source, warnings=warnings, positions=positions)

    @classmethod
    def load(cls, path, environ=None, overrides=None):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError([("", None, f"cannot read: {exc}")], path) from None
        config = cls.from_text(text, source=path, environ=environ, overrides=overrides)
        config.log_warnings()
        return config

    def log_warnings(self):
        for path, line, message in self.warnings:
            log.warning("%s%s: %s", f"{self.path}:{line}: " if line else f"{self.path}: ", path, message)

    def rerank_status(self, route):
        """Whether ``route`` (a ModelRoute) reranks: ``{"requested", "active", "provider", "reason"}``."""
        providers = self.providers["rerank"]
        if not route.rerank:
            return {"requested": False, "active": False, "provider": None, "reason": None}
        if not providers:
            return {"requested": True, "active": False, "provider": None, "reason": _NO_RERANKER}
        return {"requested": True, "active": True, "provider": next(iter(providers)), "reason": None}

    def vectorstore_type(self, kb=None):
        """The store knowledge base ``kb`` uses ("simple" or "chroma_http"); None: the global type."""
        settings = self.knowledge_bases.get(kb) if kb is not None else None
        return (settings or {}).get("vectorstore") or self.raw["vectorstore"]["type"]

    def vectorstore_status(self, kb=None):
        """What the config asks of the store (of KB ``kb``, or the global one): ``{"configured",
        "active", "reason", "set_by"}``, and for chroma_http (globally: whenever a server is
        configured) ``"chroma_http"``: the server's settings, its base_url's credentials masked,
        never the token (``has_token`` says if there is one).
        "active" is what the config makes the KB use: the same as "configured" (kept for the admin
        API's readers); whether the server answers is the KB's store_status(), not the config's."""
        kind = self.vectorstore_type(kb)
        own = kb is not None and bool((self.knowledge_bases.get(kb) or {}).get("vectorstore"))
        status = {"configured": kind, "active": kind, "reason": None,
                  "set_by": f"knowledge_bases.{kb}.vectorstore" if own else "vectorstore.type"}
        chroma = self.raw["vectorstore"]["chroma_http"]
        # The global view shows a configured server even under type simple: KBs may pick it one by one.
        if kind == "chroma_http" or (kb is None and chroma["base_url"]):
            status["chroma_http"] = {
                "base_url": loggable_url(chroma["base_url"]), "tenant": chroma["tenant"],
                "database": chroma["database"], "collection_prefix": chroma["collection_prefix"],
                "indexer": chroma["indexer"], "timeout": chroma["timeout"], "sync_interval": chroma["sync_interval"],
                "lease_ttl": chroma["lease_ttl"], "has_token": bool(chroma["token"])}
        return status


_EMPTY_FILE = ("the file is empty (or holds only comments): nothing to apply.  If an editor truncated it, "
               "restore it (an admin API save keeps the previous one as config.yaml.bak); to start over, "
               "delete it and ragproxy writes a commented default config")
_NO_RERANKER = "no rerank provider configured (providers.rerank is empty)"


def parse_config_text(text, source):
    """``(data, positions)`` of a config's text; ConfigError (with the line) if it is not YAML or empty."""
    try:
        data, positions = load_yaml(text)
    except YAMLError as exc:
        raise ConfigError([("", exc.line, f"{exc.msg} (column {exc.col})")], source) from None
    if data is None:
        raise ConfigError([("", None, _EMPTY_FILE)], source)
    return data, positions


def default_kb_settings():
    """A ``knowledge_bases`` entry with every setting at its default (as ``name: {}`` gives)."""
    return _check({}, KB_SCHEMA, (), {}, [])


def _undeclared_kbs(raw, positions):
    """Names in ``models[].kb`` with no ``knowledge_bases`` entry: name -> (key path, line, close
    declared name or None), first mention first."""
    declared, found = raw["knowledge_bases"], {}
    for i, model in enumerate(raw["models"]):
        for j, name in enumerate(model["kb"]):
            if name not in declared and name not in found and valid_kb_name(name):
                path = ("models", i, "kb", j)
                found[name] = (format_path(path), _line_of(positions, path),
                               _close_match(name, declared) if declared else None)
    return found


def _check_client_certificate(spec, path, positions, errors):
    """client_cert and client_key must load as a pair, or every https call would fail."""
    where = path + ("client_cert",)
    if not spec.get("client_cert"):
        if where not in positions:  # else client_cert itself was refused, and said so
            errors.append((format_path(where), _line_of(positions, path + ("client_key",)),
                           "client_key needs client_cert"))
        return
    import ssl   # here: only a config naming a client certificate pays for it

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(spec["client_cert"], spec.get("client_key") or None)
    except (ssl.SSLError, OSError) as exc:
        errors.append((format_path(where), _line_of(positions, where),
                       f"cannot load the client certificate{' and key' if spec.get('client_key') else ''}: {exc}"))


def _check_api_prefix(kind, spec, path, positions, errors):
    """An ollama or anthropic base_url is the server root: ragproxy adds /v1/... (or /api/...) itself."""
    base_url = spec.get("base_url")
    if spec.get("type") not in ("ollama", "anthropic") or not isinstance(base_url, str) \
            or not base_url.lower().endswith("/v1"):   # a trailing "/" is already gone
        return
    sample = "/api/embed" if kind == "embedding" else "/v1/messages" if spec["type"] == "anthropic" \
        else "/v1/chat/completions"
    where = path + ("base_url",)
    errors.append((format_path(where), _line_of(positions, where),
                   f"a type {spec['type']} base_url is the server root, without /v1: requests would go to "
                   f"{base_url}{sample}; drop the /v1 (base_url: {base_url[:-3]})"
                   + (" or, for an OpenAI-compatible endpoint, use type: openai" if kind == "llm" else "")))


_REFUSED_CHROMA = "type chroma (an in-process Chroma) is not supported: for a Chroma server use chroma_http"


def _check_vectorstore(raw, positions, errors):
    """The global vectorstore block and each KB's ``vectorstore``: a KB that ends up on
    chroma_http needs the server's address, named at the line that asked for Chroma."""
    store = raw["vectorstore"]
    if store["type"] == "chroma":
        errors.append(("vectorstore.type", _line_of(positions, ("vectorstore", "type")), _REFUSED_CHROMA))
    chroma = store["chroma_http"]
    for key in ("tenant", "database"):
        if not chroma[key]:
            errors.append((f"vectorstore.chroma_http.{key}", _line_of(positions, ("vectorstore", "chroma_http", key)),
                           f"expected a Chroma {key} name, got an empty string"))
    prefix = chroma["collection_prefix"]
    if prefix and not re.match(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}\Z", prefix):
        errors.append(("vectorstore.chroma_http.collection_prefix",
                       _line_of(positions, ("vectorstore", "chroma_http", "collection_prefix")),
                       "a Chroma collection name prefix uses letters, digits, '_', '-' and '.' (32 at most, "
                       f"starting with a letter or digit), got {prefix!r}"))
    for key in ("timeout", "sync_interval", "lease_ttl"):
        value = chroma[key]
        if isinstance(value, float) and not (value > 0 and math.isfinite(value)):
            where = ("vectorstore", "chroma_http", key)
            errors.append((format_path(where), _line_of(positions, where),
                           f"expected a finite number of seconds greater than 0, got {value!r}"))
    # Where the address is asked for: the global type, or the first KB that chose chroma_http itself.
    asked = [("vectorstore", "type")] if store["type"] == "chroma_http" else []
    for name, kb in raw["knowledge_bases"].items():
        choice = kb.get("vectorstore") if isinstance(kb, dict) else None
        where = ("knowledge_bases", name, "vectorstore")
        if choice == "chroma":
            errors.append((format_path(where), _line_of(positions, where), _REFUSED_CHROMA))
        elif choice == "chroma_http":
            asked.append(where)
    if asked and not chroma["base_url"] and ("vectorstore", "chroma_http", "base_url") not in positions:
        # (A base_url that was written but refused has its own error already.)
        where = asked[0]
        if where[0] == "vectorstore":   # the key to add, where it goes (or the type that needs it)
            errors.append(("vectorstore.chroma_http.base_url",
                           _line_of(positions, ("vectorstore", "chroma_http")) or _line_of(positions, where),
                           "type chroma_http needs base_url, the Chroma server's address (http://chroma:8000)"))
        else:
            errors.append((format_path(where), _line_of(positions, where),
                           "vectorstore chroma_http needs vectorstore.chroma_http.base_url, the Chroma server's "
                           "address (http://chroma:8000)"))


def _check_semantics(raw, positions, errors, warnings):
    """Cross-key rules the schema cannot express; ``warnings`` gets what works, but not as written."""
    for kind, providers in raw["providers"].items():
        for name, spec in providers.items():
            if isinstance(spec, dict) and (spec.get("client_cert") or spec.get("client_key")):
                _check_client_certificate(spec, ("providers", kind, name), positions, errors)
            if isinstance(spec, dict):
                _check_api_prefix(kind, spec, ("providers", kind, name), positions, errors)
    llm = raw["providers"]["llm"]
    names_seen = {}
    for i, model in enumerate(raw["models"]):
        if not isinstance(model, dict):
            continue
        path = ("models", i)
        for up in model.get("upstream") or []:
            if up not in llm:
                errors.append((format_path(path + ("upstream",)), _line_of(positions, path + ("upstream",)),
                               f"no provider {up!r} under providers.llm"
                               + (f" (have: {', '.join(llm)})" if llm else "")))
        for j, kb in enumerate(model.get("kb") or []):
            # An undeclared name is a KB over documents/<name>/ (Config.undeclared_kbs), but it
            # becomes a directory name, so it must be a valid one.
            if kb not in raw["knowledge_bases"] and not valid_kb_name(kb):
                hint = _close_match(kb, raw["knowledge_bases"]) if raw["knowledge_bases"] else None
                errors.append((format_path(path + ("kb", j)), _line_of(positions, path + ("kb", j)),
                               f"{kb!r} is not a knowledge base name: letters, digits, '_', '-' and '.' "
                               "(64 at most, starting with a letter or digit)"
                               + (f"; did you mean {hint!r}?" if hint else "")))
        if model.get("rerank") and not raw["providers"]["rerank"]:
            warnings.append((format_path(path + ("rerank",)), _line_of(positions, path + ("rerank",)),
                             f"rerank is on but there is {_NO_RERANKER}: {model.get('name')!r} is served "
                             "without reranking"))
        name = model.get("name")
        if name in names_seen:
            errors.append((format_path(path + ("name",)), _line_of(positions, path + ("name",)),
                           f"model {name!r} is already defined at models[{names_seen[name]}]"))
        names_seen[name] = i
    for name, kb in raw["knowledge_bases"].items():
        path = ("knowledge_bases", name)
        if not KB_NAME.match(name):
            errors.append((format_path(path), _line_of(positions, path),
                           "a knowledge base name uses letters, digits, '_', '-' and '.' (64 at most)"))
        if not isinstance(kb, dict):
            continue
        chunking = kb.get("chunking") or {}
        if isinstance(chunking.get("chunk_overlap"), int) and isinstance(chunking.get("chunk_size"), int) \
                and chunking["chunk_overlap"] > chunking["chunk_size"] // 2:
            errors.append((format_path(path + ("chunking", "chunk_overlap")),
                           _line_of(positions, path + ("chunking", "chunk_overlap")),
                           "chunk_overlap must be at most half of chunk_size"))
        if kb.get("retrieval") in ("dense", "hybrid") and kb.get("embedding") not in raw["providers"]["embedding"]:
            errors.append((format_path(path + ("embedding",)), _line_of(positions, path + ("embedding",)),
                           f"retrieval {kb['retrieval']} needs an embedding provider from providers.embedding"
                           + (f" (have: {', '.join(raw['providers']['embedding'])})"
                              if raw["providers"]["embedding"] else "")))
    _check_guardrails(raw["guardrails"], ("guardrails",), positions, errors)
    _check_vectorstore(raw, positions, errors)
    _check_compression(raw, positions, errors)
    if not _is_loopback(raw["server"]["host"]) and not (
            raw["api_key_auth"] and raw["api_keys"]):
        errors.append(("server.host", _line_of(positions, ("server", "host")),
                       f"listening on {raw['server']['host']} exposes the proxy to the network: "
                       "set api_key_auth: true and add api_keys, or listen on 127.0.0.1"))


def _check_key_scopes(data, raw, positions, errors, warnings):
    """security.require_acl, and key scopes naming knowledge bases the proxy does not serve.

    Reads the entries as written (``data``), not as normalised: the line to
    name is that of the entry, and a refused entry is not in ``raw``.
    """
    if raw["security"]["require_acl"] and not raw["api_key_auth"]:
        where = ("security", "require_acl")
        errors.append((format_path(where), _line_of(positions, where),
                       "require_acl needs api_key_auth: true (without keys every client reads everything)"))
    written = data.get("api_keys") if isinstance(data, dict) else None
    if not isinstance(written, list):
        return
    served = set(raw["knowledge_bases"]) | {kb for model in raw["models"] for kb in model["kb"]}
    for i, item in enumerate(written):
        where = ("api_keys", i)
        if raw["security"]["require_acl"] and not (isinstance(item, dict) and "kbs" in item and "models" in item):
            errors.append((format_path(where), _line_of(positions, where),
                           "security.require_acl is on: this key needs an explicit scope, "
                           '{key, name, kbs: [...] or "*", models: [...] or "*"}'))
        kbs = item.get("kbs") if isinstance(item, dict) else None
        for j, name in enumerate([kbs] if isinstance(kbs, str) else kbs if isinstance(kbs, list) else ()):
            if isinstance(name, str) and name != "*" and name not in served and valid_kb_name(name):
                at = where + ("kbs", j) if isinstance(kbs, list) else where + ("kbs",)
                hint = _close_match(name, served) if served else None
                # A warning: a KB deleted in the panel must not make the config unloadable.
                warnings.append((format_path(at), _line_of(positions, at),
                                 f"no knowledge base {name!r} (not under knowledge_bases nor in any "
                                 "models[].kb): this key reads nothing from it"
                                 + (f"; did you mean {hint!r}?" if hint else "")))


def _is_loopback(host):
    if host in ("localhost", "127.0.0.1", "::1"):   # the usual answers, without importing ipaddress
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loggable_url(url):
    """``url`` with its ``user:password@`` part masked, for log lines (a token is often the user)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def describe_models(config):
    llm = config.providers["llm"]

    def describe(provider):
        unchecked = provider.base_url.startswith("https:") and not provider.tls_verify
        return f"{provider.name} {loggable_url(provider.base_url)}" + (" (certificate not checked)" if unchecked else "")

    parts = []
    for route in config.models:
        ups = ", ".join(describe(llm[name]) for name in route.upstream)
        kbs = f" with kb {'+'.join(route.kb)}" if route.kb else ""
        parts.append(f"{route.name} -> {ups}{kbs}")
    return "; ".join(parts) or "no models"
