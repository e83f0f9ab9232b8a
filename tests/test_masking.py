"""Secrets in config text and views (_ragproxy.masking), with PyYAML and with parse_yaml.

mask_text masks every key in place (lines and comments kept) whatever its
quoting; restore_text puts the stored keys back where masked ones come back
unchanged, and refuses a masked value that matches no stored key.  A seeded
fuzz writes random keys in every quoting style.  The admin API's use of
them is in tests/test_admin.py.
"""
import random

import pytest

from _ragproxy import deps, masking
from _ragproxy.yamlish import YAMLError, load_yaml

CONFIG = """\
# the clients' keys
api_keys:
  - plain-client-key-0001          # laptop
  - "double-quoted-key-\\x41BC"
  - {key: 'single-quoted-key-it''s', name: ci}
providers:
  llm:
    flow: {type: openai, base_url: "https://gw/v1", api_key: flow-upstream-key-9,
           headers: {Authorization: "Bearer tok-123456789", X-Tenant: acme}}
    block:
      type: openai
      base_url: https://gw2/v1
      api_key: block-upstream-key-7   # rotated in May
      headers:
        "X-Api-Key": short
        X-Route: eu
    envref: {type: openai, base_url: "https://gw3/v1", api_key: "${GATEWAY_KEY}"}
"""
SECRETS = ["plain-client-key-0001", "double-quoted-key-ABC", "single-quoted-key-it's", "flow-upstream-key-9",
           "Bearer tok-123456789", "block-upstream-key-7", "short"]


@pytest.fixture(params=["pyyaml", "parse_yaml"])
def parser(request, monkeypatch):
    if request.param == "parse_yaml":
        monkeypatch.setattr(deps, "yaml", None)
    elif deps.yaml is None:
        pytest.skip("PyYAML is not installed")
    return request.param


def test_mask_secret_shows_enough_to_recognise_a_key():
    assert masking.mask_secret("") == ""
    assert masking.mask_secret("sk-abcdefgh1234") == "sk-\u2022\u2022\u2022\u20221234"
    assert masking.mask_secret("short") == "\u2022" * 8   # nothing of a short one
    assert masking.mask_secret("${GATEWAY_KEY}") == "${GATEWAY_KEY}"   # a reference, not the key
    assert masking.restore(masking.mask_secret("sk-abcdefgh1234"), "sk-abcdefgh1234") == "sk-abcdefgh1234"
    assert masking.restore("sk-new-key-typed", "sk-abcdefgh1234") == "sk-new-key-typed"
    assert masking.restore("\u2022" * 8, "") == "\u2022" * 8


def test_secret_headers_are_told_by_their_names():
    for name in ("Authorization", "proxy-authorization", "X-Api-Key", "api-key", "Cookie", "X-Auth-Token",
                 "X-Client-Secret"):
        assert masking.is_secret_header(name), name
    for name in ("X-Tenant", "X-Route", "Accept", "OpenAI-Organization"):
        assert not masking.is_secret_header(name), name


def test_every_key_is_masked_in_place_and_comments_stay(parser):
    masked = masking.mask_text(CONFIG)
    for secret in SECRETS:
        assert secret not in masked, secret
    assert len(masked.splitlines()) == len(CONFIG.splitlines())
    for before, after in zip(CONFIG.splitlines(), masked.splitlines()):
        if "#" in before:
            assert after.endswith(before[before.index("#"):])   # the comment is still there
    data, _ = load_yaml(masked)
    assert data["api_keys"][0] == "pla\u2022\u2022\u2022\u20220001"
    assert data["api_keys"][2] == {"key": "sin\u2022\u2022\u2022\u2022it's", "name": "ci"}
    flow = data["providers"]["llm"]["flow"]
    assert flow["headers"] == {"Authorization": "Bea\u2022\u2022\u2022\u20226789", "X-Tenant": "acme"}
    assert data["providers"]["llm"]["block"]["headers"] == {"X-Api-Key": "\u2022" * 8, "X-Route": "eu"}
    assert data["providers"]["llm"]["envref"]["api_key"] == "${GATEWAY_KEY}"
    assert "base_url: https://gw2/v1" in masked and "flow: {type: openai" in masked


def test_masked_text_sent_back_restores_every_key(parser):
    masked = masking.mask_text(CONFIG)
    edited = masked.replace("X-Route: eu", "X-Route: us")
    restored = masking.restore_text(edited, CONFIG)
    assert load_yaml(restored)[0] == load_yaml(CONFIG.replace("X-Route: eu", "X-Route: us"))[0]
    # In place, as written: only the escape in the double-quoted key is spelled out now.
    assert restored == CONFIG.replace("X-Route: eu", "X-Route: us").replace("\\x41BC", "ABC")
    assert masking.restore_text(CONFIG, CONFIG) == CONFIG   # nothing masked: nothing changes


SCOPED = """\
api_keys:
  - key: block-scoped-key-0001     # team ops
    name: ops
    kbs: [ops, runbooks]
    models:
      - "gpt-*"
      - claude-*
  - {key: "flow-scoped-key-0002", name: ci, kbs: "*", models: ["*"]}
  - {key: 'passthrough-key-0003', name: plain, kbs: []}
  - {key: "${CLIENT_KEY}", name: env, kbs: [ops], models: "*"}
"""


def test_scoped_key_mappings_mask_the_key_only_and_come_back(parser):
    masked = masking.mask_text(SCOPED)
    for secret in ("block-scoped-key-0001", "flow-scoped-key-0002", "passthrough-key-0003"):
        assert secret not in masked, secret
    assert len(masked.splitlines()) == len(SCOPED.splitlines()) and "# team ops" in masked
    data = load_yaml(masked)[0]["api_keys"]
    assert data[0] == {"key": "blo\u2022\u2022\u2022\u20220001", "name": "ops", "kbs": ["ops", "runbooks"],
                       "models": ["gpt-*", "claude-*"]}
    assert data[1] == {"key": "flo\u2022\u2022\u2022\u20220002", "name": "ci", "kbs": "*", "models": ["*"]}
    assert data[2] == {"key": "pas\u2022\u2022\u2022\u20220003", "name": "plain", "kbs": []}
    assert data[3]["key"] == "${CLIENT_KEY}"   # a reference is shown as written
    # The panel edits a scope in the editor and saves: the keys come back, the edit stays.
    edited = masked.replace("kbs: []", "kbs: [ops]")
    assert masking.restore_text(edited, SCOPED) == SCOPED.replace("kbs: []", "kbs: [ops]")


def test_the_compression_state_redis_url_is_masked_and_comes_back(parser):
    text = ("compression:\n  state:\n    backend: redis   # shared by the replicas\n"
            "    redis_url: 'redis://:hunter2-state-pass@10.0.0.5:6379/0'\n")
    masked = masking.mask_text(text)
    assert "hunter2-state-pass" not in masked and "# shared by the replicas" in masked
    assert masking.restore_text(masked, text) == text
    edited = masked.replace("backend: redis", "backend: redis ")
    assert masking.restore_text(edited, text) == text.replace("backend: redis", "backend: redis ")


def test_a_new_key_typed_over_a_mask_is_kept_and_a_key_moves_with_its_provider(parser):
    masked = masking.mask_text(CONFIG)
    typed = masked.replace("flo\u2022\u2022\u2022\u2022ey-9", "a-brand-new-upstream-key")
    assert load_yaml(masking.restore_text(typed, CONFIG))[0]["providers"]["llm"]["flow"]["api_key"] == \
        "a-brand-new-upstream-key"
    renamed = masked.replace("    block:", "    block2:")
    data = load_yaml(masking.restore_text(renamed, CONFIG))[0]
    assert data["providers"]["llm"]["block2"]["api_key"] == "block-upstream-key-7"   # its mask matches one key


def test_a_mask_that_matches_no_stored_key_is_an_error_with_its_line(parser):
    masked = masking.mask_text(CONFIG)
    forged = masked.replace("flo\u2022\u2022\u2022\u2022ey-9", "xyz\u2022\u2022\u2022\u2022ey-9")
    with pytest.raises(masking.MaskError) as info:
        masking.restore_text(forged, CONFIG)
    (path, line, message), = info.value.errors
    assert path == "providers.llm.flow.api_key" and line == 8 and "matches no stored key" in message
    # Two stored keys with the same mask: a renamed one cannot tell which it was.
    twins = "api_keys: [aaaaaaa1, aaaaaaa2]\n"
    moved = "api_keys: [aaaaaaa1]\nproviders: {llm: {p: {api_key: %s}}}\n" % ("\u2022" * 8)
    with pytest.raises(masking.MaskError, match="matches no stored key"):
        masking.restore_text(moved, twins)


def test_a_key_written_across_lines_is_masked_by_reformatting(parser):
    text = 'providers:\n  llm:\n    p:\n      api_key: "upstream-key-\n        continued-1234"\n  # bye\n'
    masked = masking.mask_text(text)
    assert "upstream-key" not in masked and "continued-1234" not in masked and "re-formatted" in masked
    assert load_yaml(masked)[0] == {"providers": {"llm": {"p": {"api_key": "ups\u2022\u2022\u2022\u20221234"}}}}
    assert load_yaml(masking.restore_text(masked, text))[0] == load_yaml(text)[0]


def test_text_that_does_not_parse_is_not_masked_and_is_passed_on_unchanged():
    with pytest.raises(YAMLError):
        masking.mask_text("api_keys: [unclosed\n")
    assert masking.restore_text("api_keys: [unclosed\n", CONFIG) == "api_keys: [unclosed\n"


_KEY_ALPHABET = "abcXYZ019-_.~+/=:#'\"\\ \u00e9\u4e2d\u2022!@%&*[]{},"


def _write_key(rng, key):
    """``key`` as a YAML scalar in a random quoting style that holds it."""
    styles = ["double", "single"]
    plain_ok = key == key.strip() and key[0] not in "-?:,[]{}#&*!|>'\"%@`\u2022 " and ": " not in key \
        and " #" not in key and not any(c in key for c in ",[]{}\u2022") and not key.endswith(":")
    if plain_ok:
        styles.append("plain")
    style = rng.choice(styles)
    if style == "plain":
        return key
    if style == "single":
        return "'" + key.replace("'", "''") + "'"
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_fuzz_random_keys_in_random_styles_never_show_and_always_come_back(parser):
    rng = random.Random(1414)
    for _ in range(60):
        keys = ["".join(rng.choice(_KEY_ALPHABET) for _ in range(rng.randrange(9, 30))) for _ in range(3)]
        keys = [k for k in keys if "\u2022" not in k] or ["fallback-key-123"]
        flow = rng.random() < 0.5
        items = ", ".join(_write_key(rng, k) for k in keys) if flow else None
        text = ("# keys\napi_keys: [" + items + "]  # flow\n") if flow else \
            "# keys\napi_keys:\n" + "".join(f"  - {_write_key(rng, k)}   # k{i}\n" for i, k in enumerate(keys))
        text += ("providers:\n  llm:\n    p: {type: openai, base_url: 'http://h/v1', api_key: "
                 + _write_key(rng, keys[0]) + "}\n")
        try:
            original = load_yaml(text)[0]
        except YAMLError:
            continue   # a key the writer above cannot quote for this parser: not what is tested
        if original["api_keys"] != keys:
            continue
        masked = masking.mask_text(text)
        for key in keys:
            assert key not in masked, (key, masked)
        assert load_yaml(masking.restore_text(masked, text))[0] == original, text
