"""Irreversible redaction of secrets and personal data in text: Redactor(categories).redact(text).

Each match is replaced by ``[REDACTED:<category>]`` and counted; what is
kept around it is what a reader needs to follow the text (the key name of a
``password = ...`` assignment, the user and host of a URL with a password,
the quotes around a quoted value).  CATEGORIES is the closed set:

- ``email``; ``phone`` (international ``+CC`` numbers, ``(area)`` and
  ``555-123-4567`` forms, trunk-prefixed national numbers such as
  ``020 7946 0958``, and any number after ``phone:``/``tel:``/``fax:``; bare
  digit runs, dates, versions and IP addresses are not phone numbers);
- ``payment_card`` (13-19 digits, Luhn-checked, a known issuer prefix, the
  usual groupings); ``iban`` (country length and mod-97 checked);
- ``private_key`` (PEM ``-----BEGIN ... PRIVATE KEY-----`` and PGP private
  blocks, also a block cut off by chunking at either end);
- ``cloud_token`` (AWS access key ids and secret keys next to their name,
  GCP API keys, Azure AccountKey/SharedAccessKey and SAS signatures);
  ``forge_token`` (GitHub, GitLab, and npm/PyPI publishing tokens);
  ``chat_token`` (Slack tokens and webhooks, Discord bot tokens and webhooks,
  Telegram bot tokens); ``jwt`` (a header that decodes to JSON with "alg");
- ``url_password`` (``scheme://user:PASSWORD@host``);
- ``secret_assignment`` (``password=``, ``api_key:``, ``"token": "..."``,
  ``Authorization: Bearer ...`` in code, YAML, JSON and env files; a value
  that is a variable, a call, an environment reference or a placeholder is
  not a secret and stays).

Rules run from the most specific to the most general and a span once
redacted is not matched again, so a token inside an assignment counts once,
under its own category.  Redacting redacted text changes nothing: a
placeholder never matches, and redact repeats until nothing more matches.

Every pattern is linear: bounded quantifiers, no nested unbounded repeats,
literal prefixes, and a cheap substring test that skips a rule whose
marker is absent (tests/test_redact.py times none of it, but runs 1 MB
pathological inputs).

May import: nothing.
"""
from __future__ import annotations

import base64
import bisect
import binascii
import json
import re

CATEGORIES = ("email", "phone", "payment_card", "iban", "private_key", "cloud_token", "forge_token",
              "chat_token", "jwt", "url_password", "secret_assignment")
PLACEHOLDER = "[REDACTED:%s]"
_PLACEHOLDER_RE = re.compile(r"\[REDACTED:[a-z_]{1,20}\]")
# redact() repeats until a pass changes nothing; each pass removes unredacted text, so this is a
# safety bound rather than a limit ever reached.
_MAX_PASSES = 8


def check_categories(categories):
    """The categories as a tuple in CATEGORIES' order; ValueError naming any unknown one."""
    if isinstance(categories, (str, bytes)):
        raise ValueError("redact categories must be a list of names, not the string %r" % (categories,))
    try:
        names = list(categories)
    except TypeError:
        raise ValueError("redact categories must be a list of names, got %r" % (categories,)) from None
    unknown = [n for n in names if n not in CATEGORIES]
    if unknown:
        raise ValueError("unknown redact categor%s %s (known: %s)" % (
            "y" if len(unknown) == 1 else "ies", ", ".join(repr(n) for n in unknown), ", ".join(CATEGORIES)))
    return tuple(c for c in CATEGORIES if c in names)


# -- checks ------------------------------------------------------------------

def luhn_ok(digits):
    """True when a digit string passes the Luhn check (payment card numbers)."""
    if not digits or not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# Registered IBAN lengths by country (SWIFT IBAN registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27,
    "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25,
    "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18,
    "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33,
    "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}


def iban_ok(iban):
    """True for an IBAN (no spaces, upper case) of its country's length whose mod-97 check is 1."""
    if len(iban) < 15 or not iban.isalnum() or not iban.isascii():
        return False
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban[2:4].isdigit():
        return False
    moved = iban[4:] + iban[:4]
    remainder = 0
    for ch in moved:
        if ch.isdigit():
            remainder = (remainder * 10 + ord(ch) - 48) % 97
        elif "A" <= ch <= "Z":
            remainder = (remainder * 100 + ord(ch) - 55) % 97
        else:
            return False
    return remainder == 1


def _card_issuer_ok(digits):
    n = len(digits)
    two, four = int(digits[:2]), int(digits[:4])
    if digits[0] == "4":                       # Visa
        return n in (13, 16, 19)
    if 51 <= two <= 55 or 2221 <= four <= 2720:  # Mastercard
        return n == 16
    if two in (34, 37):                        # American Express
        return n == 15
    if two in (36, 38, 39) or 300 <= int(digits[:3]) <= 305:   # Diners Club
        return 14 <= n <= 19
    if digits.startswith(("6011", "65")) or 644 <= int(digits[:3]) <= 649 or 622126 <= int(digits[:6]) <= 622925:
        return 16 <= n <= 19                   # Discover
    if 3528 <= four <= 3589:                   # JCB
        return 16 <= n <= 19
    if two == 62:                              # UnionPay
        return 16 <= n <= 19
    if two in (50, 56, 57, 58, 63, 67) or digits.startswith("6304"):   # Maestro
        return 12 <= n <= 19
    return False


# Groupings a printed card number comes in (digits per group).
_CARD_GROUPS = {(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 4, 4, 4, 2), (4, 4, 4, 4, 1), (4, 6, 5), (4, 6, 4),
                (4, 4, 5), (4, 4, 4, 1), (4, 4, 4, 2), (4, 4, 4, 3)}


def _card_ok(text):
    groups = re.split(r"[ -]", text)
    digits = "".join(groups)
    # 17-19 digits written solid are far more often 64-bit integers (hashes, ids) than cards
    if not 13 <= len(digits) <= (19 if len(groups) > 1 else 16):
        return False
    if len(groups) > 1:
        if len(set(re.findall(r"[ -]", text))) != 1 or tuple(len(g) for g in groups) not in _CARD_GROUPS:
            return False
    return _card_issuer_ok(digits) and luhn_ok(digits)


_PLACEHOLDER_WORDS = frozenset("""
none null nil undefined true false yes no on off empty str string bytes int integer bool boolean optional
required secret secrets password passwd pass token key apikey changeme change_me changeit replaceme replace_me
todo tbd fixme xxx placeholder dummy example sample redacted hidden masked env getenv value default any
""".split())
_PLACEHOLDER_PREFIXES = (
    "${", "$(", "{{", "%(", "<", "{", "[", "$", "%", "@", "!", "&", "*", "your", "my_", "my-", "change",
    "replace", "insert", "enter", "example", "dummy", "fake", "sample", "placeholder", "redacted",
    "process.env", "os.environ", "os.getenv", "env.", "env[", "secrets.", "self.", "this.", "config.",
    "settings.", "vault:", "keyring",
)
_MY_SECRET = re.compile(r"(?:my|your|the|some)[_\-]?(?:secret|super)?[_\-]?(?:api|app|access|auth)?[_\-]?"
                        r"(?:password|passwd|pass|secret|token|key|pw|pwd)[_\-]?[a-z0-9]{0,8}")
_MASKED = re.compile(r"[x*.#_\-\u2022\u2026]+|x{2,}[x\d]*", re.I)


def _is_placeholder(value):
    """True for a value that stands in for a secret rather than being one."""
    low = value.strip().lower()
    if len(low) < 3 or low in _PLACEHOLDER_WORDS or low.startswith(_PLACEHOLDER_PREFIXES):
        return True
    if _MASKED.fullmatch(low) or _MY_SECRET.fullmatch(low):
        return True
    return "${" in low or "{{" in low or "%(" in low or "%s" in low or "{}" in low or "{0}" in low


# -- the rules ---------------------------------------------------------------
# Most rules are _regex_finder(regex, group, check, marker): ``group`` is the part of a match that
# is replaced (0: all of it), ``check(match)`` says whether a match is one (None: always), and
# ``marker(text, lower)`` is a cheap test, once per text, that skips the regex when it says no.

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}@[A-Za-z0-9][A-Za-z0-9\-]{0,62}"
    r"(?:\.[A-Za-z0-9\-]{1,63}){0,8}\.[A-Za-z]{2,24}(?![A-Za-z0-9\-])")
_NOT_EMAIL_TLDS = frozenset("png jpg jpeg gif svg webp ico bmp tif tiff".split())


def _email_ok(m):
    local, _, domain = m.group(0).partition("@")
    return local.lower() != "git" and domain.rsplit(".", 1)[-1].lower() not in _NOT_EMAIL_TLDS


_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{1,20}://[^\s:/?#@\[\]\"'<>]{0,64}:([^\s/?#@\[\]\"'<>]{1,256})"
    r"@(?=[A-Za-z0-9\[])")


def _url_password_ok(m):
    return not _is_placeholder(m.group(1)) and not m.group(1).isdigit()   # host:port, not user:pass


_PEM_BEGIN = re.compile(r"-----BEGIN ((?:[A-Z0-9]{1,12} ){0,3}PRIVATE KEY(?: BLOCK)?)-----")
_PEM_END = re.compile(r"-----END ((?:[A-Z0-9]{1,12} ){0,3}PRIVATE KEY(?: BLOCK)?)-----")
# Inside a block: base64 lines (with the "\n" escapes of a key kept in a JSON string) and
# "Proc-Type: 4,ENCRYPTED" / "Version: ..." header lines.
_PEM_RUN = re.compile(r"(?:[A-Za-z0-9+/=]|\\n){1,20000}")
_PEM_RUN_REVERSED = re.compile(r"(?:n\\|[A-Za-z0-9+/=]){1,20000}")
_PEM_HEADER = re.compile(r"[ \t]*[A-Za-z][A-Za-z\-]{1,30}: [^\n]{0,200}")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{20}")
_PEM_MAX = 65536

_JWT = re.compile(
    r"(?<![A-Za-z0-9_\-])(eyJ[A-Za-z0-9_\-]{8,4096})\.[A-Za-z0-9_\-]{2,16384}\.[A-Za-z0-9_\-]{0,4096}"
    r"(?![A-Za-z0-9_\-])")


def _jwt_ok(m):
    head = m.group(1)
    try:
        data = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)).decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError):   # '{"a":[[[[...' nests past the limit
        return False
    return isinstance(data, dict) and "alg" in data


_FORGE = re.compile(
    r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,251}"
    r"|gl(?:pat|dt|rt|ptt|ft|imt|oas|soat|cbt|agent)-[A-Za-z0-9_\-]{20,255}(?:\.[A-Za-z0-9_\-]{1,64}){0,3}"
    r"|npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_\-]{50,1000})(?![A-Za-z0-9_\-])")
_FORGE_MARKERS = ("gh", "github_pat_", "gl", "npm_", "pypi-")

_SLACK = re.compile(r"(?<![A-Za-z0-9_\-])(?:xox[abeoprs]|xapp)-[0-9A-Za-z\-]{10,250}(?![0-9A-Za-z_\-])")
_CHAT_WEBHOOK = re.compile(
    r"https://(?:hooks\.slack\.com/(?:services|workflows|triggers)/|(?:canary\.|ptb\.)?discord(?:app)?\.com/api/"
    r"webhooks/[0-9]{5,30}/)([A-Za-z0-9_\-/+]{20,250})")
_DISCORD = re.compile(
    r"(?<![A-Za-z0-9_\-.])[MNO][A-Za-z0-9_\-]{23,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40}(?![A-Za-z0-9_\-.])")
_TELEGRAM = re.compile(r"(?<![A-Za-z0-9_:\-])[0-9]{8,10}:AA[A-Za-z0-9_\-]{32,33}(?![A-Za-z0-9_\-])")


def _discord_ok(m):
    # The first part is a base64 user id: digits once decoded.
    head = m.group(0).split(".", 1)[0]
    try:
        return base64.b64decode(head + "=" * (-len(head) % 4), altchars=b"-_").isdigit()
    except (ValueError, binascii.Error):
        return False


_AWS_KEY_ID = re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_AWS_SECRET = re.compile(
    r"(?i)aws_?secret_?(?:access_?)?key|secret_?access_?key")
_AWS_SECRET_VALUE = re.compile(r"[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])")
_GCP_KEY = re.compile(r"(?<![A-Za-z0-9_\-])AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])")
_AZURE_KEY = re.compile(r"(?i)(?<![A-Za-z0-9])(?:AccountKey|SharedAccessKey)=([A-Za-z0-9+/]{20,200}={0,2})")
_AZURE_SAS = re.compile(r"[?&]sig=([A-Za-z0-9%+/]{20,200}(?:%3D|=){0,2})")

# Phone numbers: only forms that carry their own evidence (a + country code, an (area) code, the
# 3-3-4 grouping with one separator, a trunk 0 and groups, or a "phone:" / "Tel." label before them:
# the punctuation is required, "cell 123456" is biology).
_PHONE_INTL = re.compile(
    r"(?<![A-Za-z0-9+_)\]])\+[1-9][0-9]{0,2}(?:[ .\-]?\(0?[0-9]{1,4}\))?(?:[ .\-]?[0-9]{1,5}){1,6}"
    r"(?![A-Za-z0-9_]|[.\-][0-9])")
_PHONE_AREA = re.compile(
    r"(?<![A-Za-z0-9_.\-])\([0-9]{2,5}\)[ .\-]?[0-9]{3,4}[ .\-]?[0-9]{3,4}(?![A-Za-z0-9_]|[.\-][0-9])")
_PHONE_NANP = re.compile(
    r"(?<![A-Za-z0-9_.\-+])(?:1([.\-]))?[2-9][0-9]{2}([.\-])[0-9]{3}\2[0-9]{4}(?![A-Za-z0-9_]|[.\-][0-9])")
_PHONE_TRUNK = re.compile(
    r"(?<![A-Za-z0-9_.\-+])(?<![0-9][ \-])0[1-9][0-9]{0,3}(?:[ \-][0-9]{2,8}){1,4}(?![A-Za-z0-9_]|[ .\-:][0-9])")
_PHONE_LABEL = re.compile(
    r"(?i)(?<![A-Za-z])(?:phone|tel|telephone|mobile|cell|fax|whatsapp)(?:[ \t]?(?:no|nr|number|#))?"
    r"(?:\.[ \t]{0,3}[:=]?|[ \t]{0,3}[:=])[ \t]{0,3}(\+?\(?[0-9][0-9 ().\-]{4,20}[0-9])(?![A-Za-z0-9_]|[.\-][0-9])")
_DATE_LIKE = re.compile(r"[0-9]{4}[\-./ ][0-9]{1,2}[\-./ ][0-9]{1,2}(?![0-9])|(?<![0-9])[0-9]{1,2}[\-./ ][0-9]{1,2}[\-./ ]"
                        r"(?:19|20)[0-9]{2}(?![0-9])|(?<![0-9])[0-9]{1,2}([\-./])[0-9]{1,2}\1[0-9]{2}")


def _phone_digits_ok(m, low=8, high=15):
    text = m.group(m.lastindex or 0) if m.re is _PHONE_LABEL else m.group(0)
    n = sum(ch.isdigit() for ch in text)
    return low <= n <= high


def _phone_intl_ok(m):
    text = m.group(0)
    if not _phone_digits_ok(m, 8, 15) or set(text[1:]) <= set("01"):
        return False   # too short or long, or a binary literal ("+10011010010")
    seps = re.findall(r"[ .\-()]", text)
    if seps:
        return seps != ["."]   # "+35236450.6" is a decimal
    # Solid E.164 ("+14155552671"): not an unary plus on a number in code ("c = +281474976710656").
    before = m.string[max(0, m.start() - 8):m.start()].rstrip()
    return 10 <= len(text) - 1 <= 15 and not before.endswith(tuple("=([*/<>%^|&"))


def _phone_trunk_ok(m):
    return _phone_digits_ok(m, 10, 11) and not _DATE_LIKE.search(m.group(0))


def _phone_label_ok(m):
    return _phone_digits_ok(m, 6, 15) and not _DATE_LIKE.search(m.group(1))


_CARD = re.compile(r"(?<![A-Za-z0-9_.\-])[0-9](?:[ \-]?[0-9]){12,18}(?![A-Za-z0-9_]|[.\-][0-9])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?(?![A-Za-z0-9])")

# secret assignments: the match starts at the key's last word; the key's start is found by
# walking back over identifier characters, so no lookbehind has to guess its length.
_ASSIGN = re.compile(
    r"(?i)(?:password|passwd|passphrase|pwd|pass|secret|token|key)(?P<q>[\"']?\]?)[ \t]{0,8}"
    r"(?P<sep>(?:\|\||\?\?)?=(?![=>~])|:=|:(?![:/\\])|=>)[ \t]{0,8}"
    r"(?:(?P<pre>[bBrRuU]?)(?P<quote>[\"'`])(?P<qval>(?:[^\"'`\\\n]|\\.){1,512})(?P=quote)"
    r"|(?P<val>[^\s\"'`,;(){}\[\]<>]{1,512}))")
# An unquoted value is the rest of its line (bar a trailing comma and a comment): a word
# followed by more words is prose ("password: the one you chose").
_LINE_END = re.compile(r"[ \t]*[,;]?(?:[ \t]+(?:#|//)[^\n]*)?[ \t]*\r?(?:\n|$)")
_XML_SECRET = re.compile(
    r"(?i)<((?:[A-Za-z0-9]{1,20}[_.\-]?){0,3}(?:password|passwd|secret|token|api[_\-]?key|private[_\-]?key))>"
    r"([^<>\s]{3,512})</\1>")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_KEY_SPLIT = re.compile(r"[_.\-]+|(?<=[a-z0-9])(?=[A-Z])")
_SECRET_LAST = frozenset("password passwd passphrase pwd pass secret token apikey secretkey accesskey privatekey".split())
_SECRET_LAST_TWO = frozenset(
    "api key|access key|secret key|private key|auth key|account key|signing key|encryption key|master key|app key"
    "|client secret|api secret|app secret".split("|"))
# tokenizers' special tokens (eos_token = "</s>") are vocabulary, not credentials
_NOT_SECRET_FIRST = frozenset("eos bos pad unk sep cls mask start end special max min num n".split())
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_TYPE_NAMES = frozenset("str string bytes int bool boolean optional secretstr any char text varchar".split())
_AUTH_HEADER = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-])(?:proxy-)?authorization[\"']?[ \t]{0,4}:[ \t]{0,4}(?:bearer|basic|token)[ \t]{1,4}"
    r"([A-Za-z0-9._~+/=\-]{8,4096})")


def _assign_span(text, m):
    """The value span of a ``key = value`` match that is a secret, else None."""
    key_start = m.start()
    while key_start > m.start() - 80 and key_start and text[key_start - 1] in _KEY_CHARS:
        key_start -= 1
    key_end = m.start() + len(re.match(r"[A-Za-z]+", text[m.start():m.end()]).group(0))
    key = text[key_start:key_end].lstrip("-.")  # "--password=..." is a command-line flag
    words = [w.lower() for w in _KEY_SPLIT.split(key) if w]
    if not words:
        return None
    if not (words[-1] in _SECRET_LAST or " ".join(words[-2:]) in _SECRET_LAST_TWO):
        return None
    if words[0] in _NOT_SECRET_FIRST and len(words) > 1:
        return None
    if m.group("qval") is not None:
        value, span = m.group("qval"), m.span("qval")
        if any(ch.isspace() for ch in value) or value.lower() == key.lower():
            return None   # prose ("Forgot your password?"), not a secret
    else:
        value, span = m.group("val"), m.span("val")
        cli_flag = text.startswith("--", key_start) and text[m.end():m.end() + 1] in (" ", "\t")
        if not cli_flag and not _LINE_END.match(text, m.end()):
            return None
        if value.lower() in _TYPE_NAMES or value.isdigit() and len(value) < 6:
            return None
        if _IDENTIFIER.fullmatch(value):
            # An unquoted name after "=" in code is a variable (password = new_password); in an env
            # file (PASSWORD=hunter2) and in YAML (password: hunter) it is the value itself.
            env_style = m.group("sep") == "=" and key.isupper() and text[m.end("sep") - 2:m.end("sep") - 1] != " "
            if m.group("sep") != ":" and not env_style and (value.islower() or "." in value) \
                    and not any(ch.isdigit() for ch in value):
                return None
            if "." in value and m.group("sep") != ":":
                return None
    if _is_placeholder(value) or _PLACEHOLDER_RE.search(value):
        return None
    return span


def _has_any(*needles):
    return lambda text, lower: any(n in text for n in needles)


def _has_any_lower(*needles):
    return lambda text, lower: any(n in lower for n in needles)


def _has_digits(text, lower):
    return any(ch.isdigit() for ch in text)


# -- the redactor ------------------------------------------------------------

class Redactor:
    """Redacts the chosen categories (all by default); ``redact(text) -> (new_text, {category: n})``."""

    def __init__(self, categories=CATEGORIES):
        self.categories = check_categories(categories)

    def redact(self, text):
        """``(text with every match replaced by [REDACTED:<category>], {category: count})``; never raises.

        Text that is not a str is returned as it is, with no counts.
        """
        if not isinstance(text, str) or not text:
            return text, {}
        counts = {}
        for _ in range(_MAX_PASSES):
            text, found = self._pass(text)
            if not found:
                break
            for category, n in found.items():
                counts[category] = counts.get(category, 0) + n
        return text, counts

    def _pass(self, text):
        # Claimed spans never overlap, so they sort by start and by end alike: one bisect finds
        # the only two neighbours a new span could overlap.
        lower = text.lower()
        starts, ends, spans = [], [], []
        for m in _PLACEHOLDER_RE.finditer(text) if "[REDACTED:" in text else ():
            starts.append(m.start())
            ends.append(m.end())

        def claim(start, end, category):
            if start >= end:
                return
            i = bisect.bisect_right(starts, start)
            if i and ends[i - 1] > start or i < len(starts) and starts[i] < end:
                return
            starts.insert(i, start)
            ends.insert(i, end)
            spans.append((start, end, category))

        wanted = self.categories
        for category, finder in _FINDERS:
            if category in wanted:
                for start, end in finder(text, lower):
                    claim(start, end, category)
        if not spans:
            return text, {}
        spans.sort()
        out, counts, pos = [], {}, 0
        for start, end, category in spans:
            out.append(text[pos:start])
            out.append(PLACEHOLDER % category)
            counts[category] = counts.get(category, 0) + 1
            pos = end
        out.append(text[pos:])
        return "".join(out), counts


def _regex_finder(regex, group=0, check=None, marker=None):
    def find(text, lower):
        if marker is not None and not marker(text, lower):
            return
        for m in regex.finditer(text):
            if check is None or check(m):
                yield m.span(group)
    return find


def _body_after(text, pos):
    """Where a key block cut off before its END stops: at the first line that is not part of one.

    The rest of BEGIN's own line may stop mid-line (a key in a JSON string ends at the quote);
    a later line belongs to the block whole or not at all.
    """
    limit = min(len(text), pos + _PEM_MAX)
    end, first = pos, True
    while pos < limit:
        eol = text.find("\n", pos, limit)
        eol = limit if eol < 0 else eol
        raw = text[pos:eol]
        line = raw.strip(" \t\r")
        if line and not _PEM_HEADER.fullmatch(line):
            run = _PEM_RUN.match(line)
            if not run or run.end() < len(line):
                if run and first:
                    end = pos + raw.index(line) + run.end()
                break
        if line:
            end = pos + len(raw.rstrip(" \t\r"))
        pos, first = eol + 1, False
    return end


def _body_before(text, pos):
    """Where a key block cut off above its END starts: _body_after read backwards."""
    limit = max(0, pos - _PEM_MAX)
    start, first = pos, True
    while pos > limit:
        bol = max(text.rfind("\n", limit, pos) + 1, limit)
        raw = text[bol:pos]
        line = raw.strip(" \t\r")
        if line and not _PEM_HEADER.fullmatch(line):
            run = _PEM_RUN_REVERSED.match(line[::-1])
            if not run or run.end() < len(line):
                if run and first:
                    start = bol + len(raw.rstrip(" \t\r")) - run.end()
                break
        if line:
            start = bol + len(raw) - len(raw.lstrip(" \t\r"))
        pos, first = bol - 1, False
    return start


def _private_keys(text, lower):
    if "PRIVATE KEY" not in text:
        return
    ends = [(m.start(), m.end(), m.group(1)) for m in _PEM_END.finditer(text)]
    closed = set()   # where the blocks found from their BEGIN end
    for m in _PEM_BEGIN.finditer(text):
        # a block closes at the next END, if that END has its label and is near enough
        i = bisect.bisect_left(ends, (m.end(),))
        if i < len(ends) and ends[i][2] == m.group(1) and ends[i][0] - m.end() <= _PEM_MAX:
            stop, end = ends[i][0], ends[i][1]
        else:
            stop = end = _body_after(text, m.end())
        if _BASE64_RUN.search(text, m.end(), stop):
            closed.add(end)
            yield m.start(), end
    for start, end, _ in ends:
        if end not in closed:
            begin = _body_before(text, start)
            if _BASE64_RUN.search(text, begin, start):
                yield begin, end


def _aws_secrets(text, lower):
    if "secret" not in lower or "key" not in lower:
        return
    for m in _AWS_SECRET.finditer(text):
        v = _AWS_SECRET_VALUE.match(text, m.end())
        if v:
            yield v.span(1)


def _ibans(text, lower):
    if not _has_digits(text, lower):
        return
    for m in _IBAN.finditer(text):
        # The pattern runs on over a following group of four ("... 0130 00 ABCD"): cut the match
        # at the country's length, which must fall at the end of a group.
        want = IBAN_LENGTHS.get(m.group(0)[:2])
        if want is None:
            continue
        seen = 0
        for i, ch in enumerate(m.group(0)):
            if ch != " ":
                seen += 1
                if seen == want:
                    end = m.start() + i + 1
                    break
        else:
            continue
        if (end == m.end() or text[end] == " ") and iban_ok(text[m.start():end].replace(" ", "")):
            yield m.start(), end


def _assignments(text, lower):
    if not any(w in lower for w in ("pass", "pwd", "secret", "token", "key")):
        return
    for m in _ASSIGN.finditer(text):
        span = _assign_span(text, m)
        if span:
            yield span


# In priority order: a span an earlier rule claimed is not matched again, so the specific rules
# come first (a key block's base64 is no token; a GitHub token in ``password = "..."`` is a
# forge_token; a URL's password is not the local part of an e-mail address).
_FINDERS = (
    ("private_key", _private_keys),
    ("jwt", _regex_finder(_JWT, check=_jwt_ok, marker=_has_any("eyJ"))),
    ("forge_token", _regex_finder(_FORGE, marker=_has_any(*_FORGE_MARKERS))),
    ("chat_token", _regex_finder(_CHAT_WEBHOOK, 1, marker=_has_any("hooks.slack.com", "/api/webhooks/"))),
    ("chat_token", _regex_finder(_SLACK, marker=_has_any("xox", "xapp-"))),
    ("chat_token", _regex_finder(_TELEGRAM, marker=_has_any(":AA"))),
    ("chat_token", _regex_finder(_DISCORD, check=_discord_ok, marker=_has_any("."))),
    ("cloud_token", _regex_finder(_AWS_KEY_ID, marker=_has_any("AKIA", "ASIA"))),
    ("cloud_token", _aws_secrets),
    ("cloud_token", _regex_finder(_GCP_KEY, marker=_has_any("AIza"))),
    ("cloud_token", _regex_finder(_AZURE_KEY, 1, marker=_has_any_lower("accountkey=", "sharedaccesskey="))),
    ("cloud_token", _regex_finder(_AZURE_SAS, 1, marker=_has_any("sig="))),
    ("url_password", _regex_finder(_URL_PASSWORD, 1, check=_url_password_ok, marker=_has_any("://"))),
    ("secret_assignment", _regex_finder(_AUTH_HEADER, 1, check=lambda m: not _is_placeholder(m.group(1)),
                                        marker=_has_any_lower("authorization"))),
    ("secret_assignment", _assignments),
    ("secret_assignment", _regex_finder(_XML_SECRET, 2, check=lambda m: not _is_placeholder(m.group(2)),
                                        marker=_has_any("</"))),
    ("iban", _ibans),
    ("payment_card", _regex_finder(_CARD, check=lambda m: _card_ok(m.group(0)), marker=_has_digits)),
    ("email", _regex_finder(_EMAIL, check=_email_ok, marker=_has_any("@"))),
    ("phone", _regex_finder(_PHONE_INTL, check=_phone_intl_ok, marker=_has_any("+"))),
    ("phone", _regex_finder(_PHONE_AREA, check=lambda m: _phone_digits_ok(m, 9, 12), marker=_has_any("("))),
    ("phone", _regex_finder(_PHONE_NANP, marker=_has_digits)),
    ("phone", _regex_finder(_PHONE_TRUNK, check=_phone_trunk_ok, marker=_has_digits)),
    ("phone", _regex_finder(_PHONE_LABEL, 1, check=_phone_label_ok,
                            marker=_has_any_lower("phone", "tel", "mobile", "cell", "fax", "whatsapp"))),
)
