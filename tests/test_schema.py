"""The configuration schema as data: every default obeys its own field's rules, and is the
default a config without the key gets."""

import pytest

from _ragproxy import defaults, schema
from _ragproxy.config import Config


def _fields(node, path=()):
    """(key path, Field) for every leaf under ``node``; a named or listed schema's entry as ``*``."""
    if isinstance(node, schema.Field):
        yield path, node
    elif isinstance(node, tuple):   # ("named", entry schema) or ("list", entry schema)
        yield from _fields(node[1], path + ("*",))
    else:
        for key, sub in node.items():
            yield from _fields(sub, path + (key,))


ALL_FIELDS = sorted(_fields(schema.SCHEMA), key=lambda item: item[0]) + sorted(
    (("compression", "levers", name) + path, field)
    for name, lever in schema.LEVER_SCHEMAS.items() for path, field in _fields(lever))


@pytest.mark.parametrize("path,field", ALL_FIELDS, ids=[".".join(path) for path, _ in ALL_FIELDS])
def test_every_default_obeys_its_fields_rules(path, field):
    if field.default is schema.REQUIRED or (field.default is None and field.null):
        return
    if field.choices is not None:
        assert field.default in field.choices
    if field.minimum is not None:
        assert field.default >= field.minimum
    kinds = {"str": str, "url": str, "file": str, "bool": bool, "int": int, "number": (int, float),
             "str_list": list, "map_str": dict, "key_list": list, "guardrails": dict, "compression_choice": str}
    if field.kind in kinds:
        assert isinstance(field.default, kinds[field.kind]) and (field.kind != "int" or field.default is not True)


def test_a_config_without_a_section_gets_the_schemas_defaults():
    config = Config.from_text("models: []\n")
    for section in ("server", "rag", "security", "admin", "uploads"):
        expected = {key: field.default for key, field in schema.SCHEMA[section].items()}
        assert {key: config.raw[section][key] for key in expected} == expected, section


def test_the_defaults_shared_with_the_code_come_from_defaults():
    assert schema.SCHEMA["server"]["port"].default == defaults.DEFAULT_PORT
    assert schema.SCHEMA["server"]["host"].default == defaults.DEFAULT_HOST
    assert schema.KB_SCHEMA["chunking"]["chunk_size"].default == defaults.DEFAULT_CHUNK_SIZE
    assert schema.KB_SCHEMA["bm25"]["k1"].default == defaults.BM25_K1


def test_the_panels_mapping_choices_are_the_model_schemas():
    choices = schema.model_field_choices()
    assert set(choices) == {"kb_merge", "inject_mode", "on_failure"}
    assert choices["inject_mode"] == {"default": "before_last_user",
                                      "choices": list(schema.MODEL_SCHEMA["inject_mode"].choices)}
