"""Redaction of secrets and personal data (_ragproxy.redact).

- the labelled cases in tests/data/redact/labelled.txt (fake but realistic
  secrets in code, config and prose; tricky look-alikes that must stay);
- each category with its near misses; Luhn and mod-97 at their edges;
- overlapping matches count once, under the most specific category;
- categories are selectable, unknown ones refused;
- redacting twice changes nothing; a seeded fuzz never raises;
- 1 MB pathological inputs finish (a subprocess with a generous timeout
  catches catastrophic backtracking; no duration is asserted).
"""
import os
import random
import re
import subprocess
import sys

import pytest

from _ragproxy import redact
from _ragproxy.redact import CATEGORIES, Redactor, iban_ok, luhn_ok

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LABELLED = os.path.join(HERE, "data", "redact", "labelled.txt")
MARK = re.compile(r"⟦([a-z_]+):(.*?)⟧", re.S)


def load_cases(path=LABELLED):
    """``[(kind, name, text, expected, {category: n})]`` from the labelled file (bench/redact.py reads it too)."""
    with open(path, encoding="utf-8") as f:
        parts = re.split(r"^## (positive|negative): (.*)\n", f.read(), flags=re.M)
    cases = []
    for i in range(1, len(parts), 3):
        kind, name, body = parts[i], parts[i + 1], parts[i + 2]
        counts = {}
        for m in MARK.finditer(body):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        cases.append((kind, name, MARK.sub(lambda m: m.group(2), body),
                      MARK.sub(lambda m: "[REDACTED:%s]" % m.group(1), body), counts))
    return cases


CASES = load_cases()
ALL = Redactor()


def red(text, categories=CATEGORIES):
    return Redactor(categories).redact(text)


def test_the_labelled_file_covers_every_category_and_has_negatives():
    covered = {c for kind, _, _, _, counts in CASES if kind == "positive" for c in counts}
    assert covered == set(CATEGORIES)
    assert all(not counts for kind, _, _, _, counts in CASES if kind == "negative")
    assert sum(kind == "negative" for kind, *_ in CASES) >= 5


@pytest.mark.parametrize("kind, name, text, expected, counts", CASES, ids=[c[1] for c in CASES])
def test_labelled_case(kind, name, text, expected, counts):
    out, found = ALL.redact(text)
    assert out == expected
    assert found == counts


# -- each category, with the near misses it must leave -----------------------

@pytest.mark.parametrize("category, text, expected", [
    ("email", "mail a.b-c+tag@sub.example.co.uk now", "mail [REDACTED:email] now"),
    ("email", "git@github.com:org/repo.git, icon@2x.png, @property, me@localhost, lodash@4.17.21", None),
    ("phone", "+33 1 23 45 67 89 / (020) 7946 0958 / 1-800-555-0199", "[REDACTED:phone] / [REDACTED:phone] / [REDACTED:phone]"),
    ("phone", "2021-03-04 1.2.3.4 10.0.0.255 12:00:00+01:00 1e+10 +35236450.6 x = +281474976710656", None),
    ("phone", "| 123 | 456 | 7890 |  2000 01 01 00 00 00  08-01-3697739  0.5 0.25  +10011010010", None),
    ("phone", "tel: 030 1234567; call me at tel 2021-03-04", "tel: [REDACTED:phone]; call me at tel 2021-03-04"),
    ("phone", "Tel. 1234 5678, Fax: 987654", "Tel. [REDACTED:phone], Fax: [REDACTED:phone]"),
    ("phone", "each cell 123456 and mobile 2 3 4 5 6 7, hotel: 1234567, phone 2021-03-04", None),
    ("payment_card", "card 4111-1111-1111-1111.", "card [REDACTED:payment_card]."),
    ("payment_card", "4111 1111 1111 1112, 4111 11111 1111 111, 4111-1111 1111-1111, 1234567812345670", None),
    ("iban", "IBAN: BE68 5390 0754 7034", "IBAN: [REDACTED:iban]"),
    ("iban", "BE68 5390 0754 7035, be68539007547034, XX68539007547034, BE6853900754703", None),
    ("private_key", "-----BEGIN DSA PRIVATE KEY-----\nMIIBuwIBAAKBgQD1mulWjODfx1gozRHRZTaq\n-----END DSA PRIVATE KEY-----",
     "[REDACTED:private_key]"),
    ("private_key", "-----BEGIN CERTIFICATE-----\nMIIBuwIBAAKBgQD1mulWjODfx1gozRHRZTaq\n-----END CERTIFICATE-----\n"
                    "the -----BEGIN PRIVATE KEY----- marker starts a PKCS#8 key", None),
    ("cloud_token", "id AKIAIOSFODNN7EXAMPLE, key AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI",
     "id [REDACTED:cloud_token], key [REDACTED:cloud_token]"),
    ("cloud_token", "AKIAIOSFODNN7EXAMPL (19), XAKIAIOSFODNN7EXAMPLE, AIzaShort, secret = wJalrXUtnFEMI/K7MDENG", None),
    ("forge_token", "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "[REDACTED:forge_token]"),
    ("forge_token", "ghp_short, ghx_16C7e42F292c6912E7710c838347Ae178B4a, glpat-short", None),
    ("chat_token", "xoxp-1234567890-0987654321-abcdefABCDEF", "[REDACTED:chat_token]"),
    ("chat_token", "xoxb-short, xoxz-1234567890-0987654321-abcdef, 123456789:BBHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw", None),
    ("jwt", "t=eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl;", "t=[REDACTED:jwt];"),
    ("jwt", "eyJub3QgYWxnIjoxfQ.eyJzdWIiOiJ4In0.c2ln (no alg), eyJ!!!.abc.def, eyJhbGciOiJIUzI1NiJ9 alone", None),
    ("url_password", "mongodb+srv://admin:Qw3rty!x@cluster0.example.net/db",
     "mongodb+srv://admin:[REDACTED:url_password]@cluster0.example.net/db"),
    ("url_password", "http://localhost:8080/x, ssh://git@host/repo, https://user:${PASS}@h/, ftp://u:password@h/", None),
    ("secret_assignment", 'cfg = {"password": "p@ss W0rd"}', None),   # whitespace: a sentence, not a secret
    ("secret_assignment", "export API_TOKEN='tok-82ksd92KD'", "export API_TOKEN='[REDACTED:secret_assignment]'"),
    ("secret_assignment", "os.environ['DB_PASSWORD'] = 'Xk9-pw'\nENV[\"API_SECRET\"] ||= \"s-92kd\"\n",
     "os.environ['DB_PASSWORD'] = '[REDACTED:secret_assignment]'\nENV[\"API_SECRET\"] ||= \"[REDACTED:secret_assignment]\"\n"),
    ("secret_assignment", "<db><user>app</user><password>x-ml-Pw77</password></db>",
     "<db><user>app</user><password>[REDACTED:secret_assignment]</password></db>"),
    ("secret_assignment", "<password>${DB_PASSWORD}</password> <token></token> <password-hint>x</password-hint>", None),
    ("secret_assignment", "password = None\npassword = ''\npassword = os.environ['P']\ntoken = request.token\n"
                          "api_key: ${API_KEY}\nsecret: <your-secret>\nmax_tokens: 4096\npad_token = '<pad>'\n"
                          "password_hash = 'pbkdf2:sha256'\ntoken: str = None\n", None),
])
def test_category(category, text, expected):
    out, counts = red(text, [category])
    if expected is None:
        assert (out, counts) == (text, {})
    else:
        assert out == expected
        assert set(counts) == {category}


def test_a_key_name_is_kept_and_only_the_value_goes():
    out, counts = ALL.redact('DB_PASSWORD="Xk9-hunter2"\nconst apiKey = `k-29dj2kd92`;\n')
    assert out == 'DB_PASSWORD="[REDACTED:secret_assignment]"\nconst apiKey = `[REDACTED:secret_assignment]`;\n'
    assert counts == {"secret_assignment": 2}


def test_prose_after_a_key_word_is_not_a_value():
    text = "Enter the password: the one you chose.\nToken: see below.\nThe api_key = described in the docs\n"
    assert ALL.redact(text) == (text, {})


# -- the checksums -----------------------------------------------------------

@pytest.mark.parametrize("digits, ok", [
    ("79927398713", True), ("79927398710", False), ("0", True), ("", False), ("12a4", False),
    ("4111111111111111", True), ("4111111111111112", False), ("378282246310005", True),
    ("6011111111111117", True), ("0000000000000000", True),
])
def test_luhn(digits, ok):
    assert luhn_ok(digits) is ok


def test_cards_need_luhn_an_issuer_and_a_card_length():
    assert luhn_ok("1234567812345670")   # valid Luhn, but no issuer starts with 1
    assert red("1234567812345670", ["payment_card"])[1] == {}
    assert red("0000 0000 0000 0000", ["payment_card"])[1] == {}
    # a 19-digit Visa: grouped it is a card; solid, 19 digits are far more often a 64-bit integer
    nineteen = next(n for n in ("4000000000000000%03d" % i for i in range(1000)) if luhn_ok(n))
    grouped = " ".join([nineteen[i:i + 4] for i in range(0, 16, 4)] + [nineteen[16:]])
    assert red(grouped, ["payment_card"]) == ("[REDACTED:payment_card]", {"payment_card": 1})
    assert red(nineteen, ["payment_card"])[1] == {}
    # Amex is 15 digits: a 16-digit number starting 34 is not one
    amex16 = next(n for n in ("34000000000000%02d" % i for i in range(100)) if luhn_ok(n))
    assert red(amex16, ["payment_card"])[1] == {}


@pytest.mark.parametrize("iban, ok", [
    ("GB82WEST12345698765432", True), ("GB82WEST12345698765433", False),   # one digit off
    ("GB28WEST12345698765432", False),                                     # check digits swapped
    ("GB82WEST1234569876543", False), ("GB82WEST123456987654321", False),   # a country's length is exact
    ("NO9386011117947", True), ("LC55HEMM000100010012001200023015", True),  # shortest and longest
    ("MT84MALT011000012345MTLCAST001S", True),                              # letters inside the BBAN
    ("QQ82WEST12345698765432", False), ("gb82west12345698765432", False), ("GBX2WEST12345698765432", False),
    ("", False), ("DE89 3704 0044 0532 0130 00", False),                   # iban_ok takes no spaces
])
def test_mod97(iban, ok):
    assert iban_ok(iban) is ok


def test_an_iban_stops_at_its_countrys_length():
    out, counts = red("DE89 3704 0044 0532 0130 00 ABCD EFGH and NO93 8601 1117 947 1234", ["iban"])
    assert out == "[REDACTED:iban] ABCD EFGH and [REDACTED:iban] 1234"
    assert counts == {"iban": 2}


# -- overlaps, selection -----------------------------------------------------

def test_a_url_password_wins_over_the_email_its_host_looks_like():
    out, counts = ALL.redact("https://alice:s3cret@example.com/ and postgres://bob:pw.1@db.example.org:5432")
    assert out == ("https://alice:[REDACTED:url_password]@example.com/ and "
                   "postgres://bob:[REDACTED:url_password]@db.example.org:5432")
    assert counts == {"url_password": 2}


def test_a_token_in_an_assignment_counts_once_under_its_own_category():
    text = 'token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"'
    assert ALL.redact(text) == ('token = "[REDACTED:forge_token]"', {"forge_token": 1})
    # without forge_token the assignment rule still takes it
    cats = [c for c in CATEGORIES if c != "forge_token"]
    assert red(text, cats) == ('token = "[REDACTED:secret_assignment]"', {"secret_assignment": 1})


def test_a_key_block_is_one_redaction_whatever_it_contains():
    block = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nAKIAIOSFODNN7EXAMPLE\n"
             "-----END PRIVATE KEY-----")
    assert ALL.redact(block) == ("[REDACTED:private_key]", {"private_key": 1})


def test_only_the_chosen_categories_are_redacted():
    text = "alice@example.org +44 20 7946 0958 AKIAIOSFODNN7EXAMPLE"
    assert red(text, ["email"]) == ("[REDACTED:email] +44 20 7946 0958 AKIAIOSFODNN7EXAMPLE", {"email": 1})
    assert red(text, ("phone", "cloud_token")) == (
        "alice@example.org [REDACTED:phone] [REDACTED:cloud_token]", {"phone": 1, "cloud_token": 1})
    assert red(text, []) == (text, {})


@pytest.mark.parametrize("bad, message", [
    (["email", "ssn"], "unknown redact category 'ssn'"),
    (["a", "b"], "unknown redact categories 'a', 'b'"),
    ("email", "not the string 'email'"),
    (7, "a list of names"),
])
def test_unknown_categories_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Redactor(bad)
    with pytest.raises(ValueError, match=re.escape(message)):
        redact.check_categories(bad)


def test_check_categories_keeps_the_canonical_order():
    assert redact.check_categories(["jwt", "email", "jwt"]) == ("email", "jwt")


def test_a_jwt_header_nested_past_the_recursion_limit_is_no_jwt_and_no_error():
    import base64
    head = base64.urlsafe_b64encode(b'{"a":' + b"[" * 2900).decode().rstrip("=")
    text = head + ".eyJhIjoxfQ.c2ln"
    assert len(head) <= 4096   # within the pattern's bound, so the header is decoded
    assert red(text, ["jwt"]) == (text, {})


@pytest.mark.parametrize("value", [None, b"alice@example.org", 42, ""])
def test_anything_but_text_comes_back_as_it_is(value):
    assert ALL.redact(value) == (value, {})


# -- idempotence, fuzz, pathological input ----------------------------------

@pytest.mark.parametrize("kind, name, text, expected, counts", CASES, ids=[c[1] for c in CASES])
def test_redacting_twice_is_redacting_once(kind, name, text, expected, counts):
    once, _ = ALL.redact(text)
    assert ALL.redact(once) == (once, {})


FRAGMENTS = [
    "a", "Z", "0", "7", "42", " ", "  ", "\n", "\t", "-", "_", ".", ":", "/", "+", "=", "@", "(", ")", "'", '"', "`",
    "#", ";", ",", "\\n", "é", "\u200b", "[", "]", "://", "https://", "user:", "pass", "@host.example.com",
    "alice@example.org", "+44 20 7946 0958", "(555) 123-4567", "020 7946 0958", "4111 1111 1111 1111",
    "4111111111111111", "GB82 WEST 1234 5698 7654 32", "NO9386011117947", "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----", "-----BEGIN PRIVATE KEY-----", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    "AKIAIOSFODNN7EXAMPLE", "aws_secret_access_key = ", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI", "AccountKey=", "&sig=", "ghp_", "16C7e42F292c6912E7710c838347Ae178B4a",
    "glpat-", "xoxb-", "hooks.slack.com/services/", "eyJhbGciOiJIUzI1NiJ9", "eyJ", "password", "password = ",
    "api_key: ", "TOKEN=", '"secret": "', "Authorization: Bearer ", "tel: ", "[REDACTED:email]", "[REDACTED:",
    "${VAR}", "None", "os.environ", "110201543:AA", "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.",
]


def fuzz_text(rng):
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 60)))


def test_seeded_fuzz_never_raises_counts_every_placeholder_and_is_idempotent():
    rng = random.Random(1729)
    for _ in range(2000):
        text = fuzz_text(rng)
        categories = rng.sample(CATEGORIES, rng.randrange(1, len(CATEGORIES) + 1))
        r = Redactor(categories)
        out, counts = r.redact(text)
        assert set(counts) <= set(categories) and all(n > 0 for n in counts.values())
        for category, n in counts.items():
            assert out.count("[REDACTED:%s]" % category) - text.count("[REDACTED:%s]" % category) == n, text
        assert r.redact(out) == (out, {}), text


def test_seeded_fuzz_of_random_characters_never_raises():
    rng = random.Random(31337)
    alphabet = "aZ09 \n\t-_.:/+=@()'\"#;,\\[]{}<>$%!*&|~?^é\u200b\x00"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400)))
        out, counts = ALL.redact(text)
        assert ALL.redact(out) == (out, {})


PATHOLOGICAL = r'''
import sys
sys.path.insert(0, sys.argv[1])
from _ragproxy.redact import Redactor
N = 1 << 20
def rep(s):
    return (s * (N // len(s) + 1))[:N]
cases = [rep(s) for s in (
    "a", "1", "1 ", "1-", "+1 ", "+12", "(12) ", "01 ", "@", "a@", "a.", "a-", "\n", "\\n", "=",
    "-----BEGIN PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----\n", "-----END PRIVATE KEY-----\n",
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo\n-----END PRIVATE KEY-----\n", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo",
    "password=", "password: x ", "key=a", 'token = "', "eyJaaaaaaaaa.", "eyJhbGciOiJIUzI1NiJ9.eyJ.", "://",
    "http://a:", "AKIA", "GB82 ", "GB82WEST", "ghp_", "glpat-a.", "xoxb-", "MTIzNDU2Nzg5MDEyMzQ1Njc4.", "tel: 1 ",
    "&sig=", "Authorization: Bearer ", "a1@b.c:d/-_+= \n", "4111 1111 1111 1111 ", "+44 20 7946 0958 ",
    "password=hunter2-Xk9\n", "[REDACTED:", "[REDACTED:email]",
)]
cases += ["x@" + rep("a."), rep("a.") + "@", "-----BEGIN PRIVATE KEY-----\n" + rep("QUJDREVGR0hJSktMTU5P\n"),
          'password = "' + rep("a"), "eyJ" + rep("a"), "http://u:" + rep("p")]
r = Redactor()
for text in cases:
    r.redact(text)
print(len(cases))
'''


@pytest.mark.slow
def test_pathological_megabyte_inputs_finish():
    # Linear patterns take well under a second a case here; catastrophic backtracking would take
    # hours.  The timeout only tells the two apart (shared, slow CI machines included).
    proc = subprocess.run([sys.executable, "-c", PATHOLOGICAL, ROOT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == 50
