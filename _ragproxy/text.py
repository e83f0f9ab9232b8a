"""Text analysis for lexical retrieval, with no model: the analyzer and its stemmer.

An analyzer that understands both English prose and source code (case
folding, identifier splitting that keeps the whole identifier, stopwords,
Snowball stemming, CJK bigrams).  The index its tokens go into is ``bm25``'s.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import itertools
import re
import sys
import unicodedata

# --------------------------------------------------------------------------
# English stemmer: Snowball English ("Porter2"), written from the published
# algorithm description at snowballstem.org.  Input is a lowercase ASCII word.

_VOWELS = frozenset("aeiouy")
_DOUBLES = frozenset(("bb", "dd", "ff", "gg", "mm", "nn", "pp", "rr", "tt"))
_LI_ENDINGS = frozenset("cdeghkmnrt")
_STEM_SPECIAL = {
    "skis": "ski", "skies": "sky", "dying": "die", "lying": "lie",
    "tying": "tie", "idly": "idl", "gently": "gentl", "ugly": "ugli",
    "early": "earli", "only": "onli", "singly": "singl", "sky": "sky",
    "news": "news", "howe": "howe", "atlas": "atlas", "cosmos": "cosmos",
    "bias": "bias", "andes": "andes",
}
_STEM_KEEP_AFTER_1A = frozenset((
    "inning", "outing", "canning", "herring", "earring",
    "proceed", "exceed", "succeed"))
_STEP2 = {
    "tional": "tion", "enci": "ence", "anci": "ance", "abli": "able",
    "entli": "ent", "izer": "ize", "ization": "ize", "ational": "ate",
    "ation": "ate", "ator": "ate", "alism": "al", "aliti": "al", "alli": "al",
    "fulness": "ful", "ousli": "ous", "ousness": "ous", "iveness": "ive",
    "iviti": "ive", "biliti": "ble", "bli": "ble", "ogi": "og", "fulli": "ful",
    "lessli": "less", "li": "",
}
_STEP3 = {
    "tional": "tion", "ational": "ate", "alize": "al", "icate": "ic",
    "iciti": "ic", "ical": "ic", "ful": "", "ness": "", "ative": "",
}
_STEP4 = frozenset((
    "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment",
    "ent", "ism", "ate", "iti", "ous", "ive", "ize", "ion"))


def _suffix_finder(table):
    """Function returning the longest suffix of a word found in ``table``, or ''."""
    endings = tuple(table)
    lengths = sorted({len(s) for s in table}, reverse=True)

    def longest(word):
        # One C-level endswith() rules out most words before the loop.
        if not word.endswith(endings):
            return ""
        size = len(word)
        for n in lengths:
            if n < size and word[-n:] in table:
                return word[-n:]
        return ""
    return longest


_step2_suffix = _suffix_finder(_STEP2)
_step3_suffix = _suffix_finder(_STEP3)
_step4_suffix = _suffix_finder(_STEP4)


_VOWEL_THEN_CONSONANT = re.compile("[aeiouy][^aeiouy]")


def _region_start(word, start):
    """Index after the first non-vowel that follows a vowel, from ``start`` on."""
    match = _VOWEL_THEN_CONSONANT.search(word, start)
    return match.end() if match else len(word)


def _ends_short_syllable(word):
    n = len(word)
    if n == 2:
        return word[0] in _VOWELS and word[1] not in _VOWELS
    return (n >= 3 and word[-3] not in _VOWELS and word[-2] in _VOWELS
            and word[-1] not in _VOWELS and word[-1] not in "wxY")


def stem_english(word):
    """Snowball English (Porter2) stem of a lowercase ASCII word."""
    if len(word) <= 2:
        return word
    special = _STEM_SPECIAL.get(word)
    if special is not None:
        return special
    # 'Y' marks a y that acts as a consonant; it is not in _VOWELS.
    if "y" in word:
        chars = list(word)
        if chars[0] == "y":
            chars[0] = "Y"
        for i in range(1, len(chars)):
            if chars[i] == "y" and chars[i - 1] in _VOWELS:
                chars[i] = "Y"
        word = "".join(chars)
    if word.startswith(("gener", "arsen")):
        r1 = 5
    elif word.startswith("commun"):
        r1 = 6
    else:
        r1 = _region_start(word, 0)
    r2 = _region_start(word, r1)

    # Step 1a: plurals.
    if word.endswith("sses"):
        word = word[:-2]
    elif word.endswith(("ied", "ies")):
        word = word[:-2] if len(word) > 4 else word[:-1]
    elif word.endswith(("us", "ss")):
        pass
    elif word.endswith("s"):
        if any(c in _VOWELS for c in word[:-2]):
            word = word[:-1]
    if word in _STEM_KEEP_AFTER_1A:
        return word

    # Step 1b: past tense and gerunds.
    for suffix in ("eedly", "ingly", "edly", "eed", "ing", "ed"):
        if word.endswith(suffix):
            stem = word[:-len(suffix)]
            if suffix in ("eed", "eedly"):
                if len(stem) >= r1:
                    word = stem + "ee"
            elif any(c in _VOWELS for c in stem):
                word = stem
                if word.endswith(("at", "bl", "iz")):
                    word += "e"
                elif word[-2:] in _DOUBLES:
                    word = word[:-1]
                elif r1 >= len(word) and _ends_short_syllable(word):
                    word += "e"
            break

    # Step 1c: final y after a consonant (not the first letter) becomes i.
    if len(word) > 2 and word[-1] in "yY" and word[-2] not in _VOWELS:
        word = word[:-1] + "i"

    # Step 2: derivational suffixes, in R1.
    suffix = _step2_suffix(word)
    if suffix and len(word) - len(suffix) >= r1:
        stem = word[:-len(suffix)]
        if suffix == "ogi":
            if stem.endswith("l"):
                word = stem + "og"
        elif suffix == "li":
            if stem[-1:] in _LI_ENDINGS:
                word = stem
        else:
            word = stem + _STEP2[suffix]

    # Step 3.
    suffix = _step3_suffix(word)
    if suffix and len(word) - len(suffix) >= r1:
        if suffix != "ative" or len(word) - 5 >= r2:
            word = word[:-len(suffix)] + _STEP3[suffix]

    # Step 4: residual suffixes, in R2.
    suffix = _step4_suffix(word)
    if suffix and len(word) - len(suffix) >= r2:
        stem = word[:-len(suffix)]
        if suffix != "ion" or stem[-1:] in ("s", "t"):
            word = stem

    # Step 5: final e and ll.
    if word.endswith("e"):
        pos = len(word) - 1
        if pos >= r2 or (pos >= r1 and not _ends_short_syllable(word[:-1])):
            word = word[:-1]
    elif word.endswith("ll") and len(word) - 1 >= r2:
        word = word[:-1]
    return word.replace("Y", "y")


# --------------------------------------------------------------------------
# Analyzer

#: English function words dropped from prose and from identifier parts.  Kept
#: short on purpose: quantifiers, negations and prepositions ("all", "any",
#: "not", "no", "before", "between", "only", "same") carry meaning in
#: questions about code, and leaving them in measured slightly better on code
#: search (CoSQA) with no loss on prose (SciFact).  Compared after casefolding.
ENGLISH_STOPWORDS = frozenset("""
a about am an and are as at be because been being both but by can could did do
does doing for from had has have having he her here hers herself him himself his
how i if in into is it its itself just me my myself of on or our ours ourselves
she should so such than that the their theirs them themselves then there these
they this those to was we were what when where which while who whom why will
with would you your yours yourself yourselves
""".split())

# Word characters joined by "." or "/" form one compound (a dotted name, a
# path); the compound is indexed whole and by its parts.  "::" (C++, Rust) is
# read as "/" first, so ``std::fs::File`` is the compound ``std/fs/file``.
_COMPOUND_RE = re.compile(r"\w+(?:[./]\w+)*")
_CJK_CLASS = ("\u1100-\u11ff\u3040-\u30ff\u3100-\u312f\u3130-\u318f"
              "\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
              "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"
              "\U00020000-\U0002fa1f")
_CJK_RE = re.compile("[%s]" % _CJK_CLASS)
_CJK_SPLIT_RE = re.compile("([%s]+)" % _CJK_CLASS)
# Identifier pieces: acronyms (HTTP in parseHTTPResponse), capitalised or
# lowercase words, digit runs.  ASCII fast path; other scripts split on
# underscores and letter/digit boundaries only.
_ASCII_PIECE_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_UNICODE_PIECE_RE = re.compile(r"[^\W\d_]+|\d+")
_RECEIVERS = ("self.", "cls.", "this.")
_MAX_TOKEN_LEN = 64
_CACHE_LIMIT = 1 << 20   # ~250 MB of cached analyses at ~240 bytes each
_CACHE_KEY_MAX = 100
_chain = itertools.chain.from_iterable
_drain = functools.partial(collections.deque, maxlen=0)
_intern = sys.intern
# ASCII punctuation that can never be inside a compound, mapped to spaces.
# "+" and "#" stay, for the names below; _analyze_piece drops them otherwise.
# Every other ASCII character maps to itself: str.translate looks each distinct
# character up once a call, and one missing from the table costs a KeyError
# raised and cleared (a question's ~20 letters made translating it 2.5x slower).
_PUNCT_BLANKED = "!\"$%&'()*,-:;<=>?@[\\]^`{|}~"
_BLANK_PUNCT = str.maketrans({chr(c): " " if chr(c) in _PUNCT_BLANKED else chr(c) for c in range(128)})
# Names spelled mostly in punctuation would lose it and be a letter or a
# common word ("C++" the letter c, ".NET" the word net): each is one term
# instead, the same as its spelled-out forms (cxx in CMAKE_CXX_STANDARD or
# file.cxx, cplusplus), so a question about "the C++ standard" finds them.
# "c++17" is c++ then 17; "abc++" and "x.c++" are not names.
_NAMED_RE = re.compile(r"(?<![\w+#.])(?:([Cc])\+\+|([CcFf])#|\.([Nn][Ee][Tt]))(?![A-Za-z_+#])")
_NAMED_TERMS = {"c++": "cpp", "c#": "csharp", "f#": "fsharp", ".net": "dotnet"}
_SYNONYMS = {"cxx": "cpp", "cplusplus": "cpp"}
#: Bump when the terms the analyzer gives for some text change: indexes built
#: before then must be rebuilt (a knowledge base stores it with its settings).
ANALYZER_VERSION = 2


class _WordCache(dict):
    """raw word -> its terms (a tuple); a miss analyzes the word and remembers it."""

    __slots__ = ("analyze",)

    def __init__(self, analyze):
        super().__init__()
        self.analyze = analyze

    def __missing__(self, raw):
        terms = self.analyze(raw)
        if len(raw) <= _CACHE_KEY_MAX:   # long pieces are one-off blobs
            self[raw] = terms
        return terms


class Analyzer:
    """Turns text into index terms; the same instance analyzes documents and queries.

    * NFKC normalisation and ``str.casefold``; split on non-word characters.
    * Identifiers give their parts and the whole: ``parseHTTPResponse`` gives
      ``parse http respons parsehttpresponse``; ``snake_case`` and letter/digit
      boundaries (``utf8``) split too.  Wholes are not stemmed.
    * Dotted names and paths (``os.path.join``, ``src/foo/bar.py``,
      ``std::fs::File`` read as ``std/fs/file``) also give the whole compound,
      so a question naming one matches it exactly; a leading ``self.``,
      ``cls.`` or ``this.`` is left out of the whole.
    * ``C++``, ``C#``, ``F#`` and ``.NET`` are the terms ``cpp``, ``csharp``,
      ``fsharp`` and ``dotnet`` (``cxx`` and ``cplusplus`` are ``cpp`` too);
      elsewhere ``+`` and ``#`` are punctuation.
    * English stopwords are dropped; the stemmer is Snowball English (Porter2).
    * CJK runs become overlapping character bigrams (a lone character stays).

    Analysis is memoised per distinct word (~240 bytes each, cleared past 1M
    words): reuse one instance, and call :meth:`clear_cache` after a large
    indexing run to give the memory back.
    """

    def __init__(self, stopwords=True, stemmer="porter", split_identifiers=True,
                 cjk_bigrams=True):
        if stemmer not in ("porter", None):
            raise ValueError("unknown stemmer %r (use 'porter' or None)" % (stemmer,))
        if stopwords is True:
            stopwords = ENGLISH_STOPWORDS
        self.stopwords = frozenset(stopwords or ())
        self.stemmer = stemmer
        self.split_identifiers = split_identifiers
        self.cjk_bigrams = cjk_bigrams
        self._terms = {}           # casefolded word -> (term,) or ()
        self._word_cache = _WordCache(self._analyze_piece)

    def tokens(self, text):
        """Index terms of ``text``, in order, with repeats."""
        return self._text_terms(text, repeats=True)

    def tokens_many(self, texts):
        """``[self.tokens(t) for t in texts]``, faster for large batches.

        Python's cyclic garbage collector would walk every token list built so
        far, again and again, as the batch grows (about a fifth of the time at
        100k chunks); nothing here forms reference cycles, so it is paused.
        """
        with gc_paused():
            return [self.tokens(t) for t in texts]

    def query_tokens(self, text):
        """Terms of a question: like :meth:`tokens`, each term once, first-seen order.

        Repeating a word in a question should not multiply its weight; long
        pasted snippets would otherwise be dominated by their commonest words.
        """
        return list(dict.fromkeys(self._text_terms(text, repeats=False)))

    def clear_cache(self):
        """Forget memoised analyses (results do not change, only speed)."""
        self._word_cache.clear()
        self._terms.clear()

    # -- internals ---------------------------------------------------------

    def _text_terms(self, text, repeats):
        """Terms of ``text`` in order; without ``repeats``, a repeated word's terms
        come only from its first occurrence (and may still repeat across words)."""
        if not text:
            return []
        text = text.replace("::", "/")
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text)
            if self.cjk_bigrams and _CJK_RE.search(text):
                return self._tokens_with_cjk(text)
        cache = self._word_cache
        if len(cache) > _CACHE_LIMIT:
            self.clear_cache()
        # Blanking ASCII punctuation and splitting is twice as fast as a regex
        # scan; each distinct piece is then analyzed once (see _WordCache).
        pieces = text.translate(_BLANK_PUNCT).split()
        if not repeats:   # a pasted question repeats its words: a dict drops them at C speed
            pieces = dict.fromkeys(pieces)
        # Draining map(out.extend, ...) into a zero-length deque keeps the
        # per-piece loop in C.
        out = []
        _drain(map(out.extend, map(cache.__getitem__, pieces)))
        return out

    def _tokens_with_cjk(self, text):
        out = []
        for i, chunk in enumerate(_CJK_SPLIT_RE.split(text)):
            if i % 2:
                if len(chunk) == 1:
                    out.append(chunk)
                else:
                    out.extend(chunk[j:j + 2] for j in range(len(chunk) - 1))
            elif chunk:
                for raw in chunk.translate(_BLANK_PUNCT).split():
                    out.extend(self._word_cache[raw])
        return out

    def _analyze_piece(self, piece):
        """Terms of one whitespace-free piece (may still hold Unicode punctuation).

        Called once per distinct piece, which on code is ~5% of all pieces but
        a third of the tokenizing time, hence the fast paths.
        """
        if "+" in piece or "#" in piece or ".n" in piece or ".N" in piece:
            named = _NAMED_RE.sub(_named_term, piece)
            if named != piece or "+" in piece or "#" in piece:
                return tuple(_chain(map(self._word_cache.__getitem__,
                                        named.replace("+", " ").replace("#", " ").split())))
        if not piece.isascii():
            matches = _COMPOUND_RE.findall(piece)
            if len(matches) != 1 or matches[0] != piece:
                # "«name»" or "a—b": analyze the clean parts through the cache.
                return tuple(_chain(map(self._word_cache.__getitem__, matches)))
        # After _BLANK_PUNCT only "." and "/" can separate word characters.
        if "." in piece or "/" in piece:
            parts = piece.replace("/", ".").split(".")
            if not all(parts):  # ".attr", "end.", "a..b"
                return tuple(_chain(map(self._word_cache.__getitem__,
                                        _COMPOUND_RE.findall(piece))))
            return self._analyze_compound(piece, parts)
        return self._analyze_word(piece)

    def _analyze_compound(self, raw, parts):
        cache = self._word_cache
        out = []
        for part in parts:
            out += cache[part]
        whole = raw.casefold()
        if whole.startswith(_RECEIVERS):
            # "self.cache.get" is indexed as "cache.get": questions name the
            # attribute, not the receiver; a lone "self.x" adds nothing.
            whole = whole[whole.index(".") + 1:]
            if "." not in whole and "/" not in whole:
                return tuple(out)
        if self.split_identifiers and len(whole) <= _MAX_TOKEN_LEN:
            out.append(whole)
        return tuple(out)

    def _analyze_word(self, raw):
        """Terms of one run of word characters (an identifier or a word)."""
        if raw.isascii():
            if raw.isalpha() and (raw.islower() or raw.istitle() or raw.isupper()):
                return self._word_terms(raw.lower())   # a plain word
            if raw.isdigit():
                return self._word_terms(raw)
            whole = raw.lower()
            if not self.split_identifiers:
                pieces = ()
            elif whole == raw and whole.replace("_", "").isalpha():
                pieces = whole.split("_")              # snake_case, the common case
            else:
                pieces = _ASCII_PIECE_RE.findall(raw)
            whole = whole.strip("_")
        else:
            pieces = _UNICODE_PIECE_RE.findall(raw) if self.split_identifiers else ()
            whole = raw.casefold().strip("_")
        get = self._terms.get
        out = []
        n = 0
        for piece in pieces:
            if piece:
                n += 1
                piece = piece.casefold()
                terms = get(piece)
                out += terms if terms is not None else self._word_terms(piece)
        if n <= 1:
            return self._word_terms(whole)
        if len(whole) <= _MAX_TOKEN_LEN:
            out.append(whole)
        return tuple(out)

    def _word_terms(self, word):
        """``(term,)`` for one casefolded word, or ``()`` for a stopword.

        The tuples are shared, so every occurrence of a term in every cached
        analysis is the same interned string.
        """
        terms = self._terms.get(word)
        if terms is None:
            word = _SYNONYMS.get(word, word)
            if not word or word in self.stopwords or len(word) > _MAX_TOKEN_LEN:
                terms = ()
            elif self.stemmer is not None and word.isascii() and word.isalpha():
                terms = (_intern(stem_english(word)),)
            else:
                terms = (_intern(word),)
            self._terms[word] = terms
        return terms


def _named_term(m):
    return " %s " % _NAMED_TERMS[m.group(0).lower()]


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic GC while building large acyclic structures."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
