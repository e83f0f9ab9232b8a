"""Text analysis (_ragproxy.text): the analyzer and the stemmer.

In-process; what the analyzer's tokens find in an index is checked with
BM25Index, whose own tests are test_bm25's.
"""
import random

import pytest

from ragproxy import Analyzer, BM25Index, stem_english


# --------------------------------------------------------------------------
# Stemmer: Snowball English (Porter2).  Expected stems worked out from the
# published algorithm; several are the examples in its own description.

STEMS = [
    ("consign", "consign"), ("consigned", "consign"), ("consigning", "consign"),
    ("consignment", "consign"), ("consistency", "consist"), ("consistently", "consist"),
    # Step 2 ation -> ate, then step 4 deletes ate in R2.
    ("consolation", "consol"),
    # Step 1c turns the final y into i; nothing else applies.
    ("consolatory", "consolatori"),
    ("consolidate", "consolid"), ("knackeries", "knackeri"), ("kneaded", "knead"),
    ("kneeling", "kneel"),
    # Step 5 keeps the e: "kniv" ends in a short syllable.
    ("knives", "knive"),
    # Step 1c y -> i, then step 2 deletes li after t.
    ("knightly", "knight"),
    ("caresses", "caress"), ("ponies", "poni"), ("ties", "tie"), ("cries", "cri"),
    ("gaps", "gap"), ("gas", "gas"), ("kiwis", "kiwi"),
    # Step 1b: "hop" is a short word, so e comes back; "hopp" loses a double.
    ("hoping", "hope"), ("hopping", "hop"), ("running", "run"),
    ("happily", "happili"), ("generously", "generous"), ("agreed", "agre"),
    ("luxuriated", "luxuri"), ("relational", "relat"), ("conditional", "condit"),
    ("sensitivity", "sensit"), ("hopefulness", "hope"), ("electricity", "electr"),
    ("adjustable", "adjust"), ("controllable", "control"), ("replacement", "replac"),
    ("adoption", "adopt"), ("effective", "effect"), ("fizzed", "fizz"),
    ("filing", "file"), ("sized", "size"), ("troubled", "troubl"),
    # R1 starts after gener / commun / arsen.
    ("generate", "generat"), ("communism", "communism"), ("arsenal", "arsenal"),
    # Exceptional forms.
    ("skies", "sky"), ("dying", "die"), ("news", "news"), ("proceed", "proceed"),
    ("succeeded", "succeed"),
    # y after a vowel is a consonant; two-letter words are left alone.
    ("say", "say"), ("cry", "cri"), ("by", "by"),
]


@pytest.mark.parametrize("word,stem", STEMS)
def test_stem_english(word, stem):
    assert stem_english(word) == stem


# --------------------------------------------------------------------------
# Analyzer


def test_identifiers_give_parts_and_whole():
    plain = Analyzer(stemmer=None)
    assert plain.tokens("parseHTTPResponse") == ["parse", "http", "response", "parsehttpresponse"]
    assert plain.tokens("get_user_name") == ["get", "user", "name", "get_user_name"]
    assert plain.tokens("XMLHttpRequest") == ["xml", "http", "request", "xmlhttprequest"]
    assert plain.tokens("utf8Decode") == ["utf", "8", "decode", "utf8decode"]
    assert plain.tokens("__init__") == ["init"]


def test_identifier_parts_are_stemmed_but_wholes_are_not():
    assert Analyzer().tokens("parseHTTPResponse") == ["pars", "http", "respons", "parsehttpresponse"]


def test_stopword_parts_are_dropped_but_the_whole_stays():
    assert Analyzer(stemmer=None).tokens("is_valid") == ["valid", "is_valid"]


def test_dotted_names_and_paths_give_parts_and_whole():
    plain = Analyzer(stemmer=None)
    assert plain.tokens("call os.path.join(a, b)") == [
        "call", "os", "path", "join", "os.path.join", "b"]
    assert plain.tokens("see src/foo/bar.py") == ["see", "src", "foo", "bar", "py", "src/foo/bar.py"]
    # C++ / Rust paths read the same way whichever separator a question uses.
    assert plain.tokens("std::fs::File") == ["std", "fs", "file", "std/fs/file"]
    assert plain.tokens("std/fs/File") == plain.tokens("std::fs::File")


def test_receiver_is_left_out_of_the_whole():
    plain = Analyzer(stemmer=None)
    assert plain.tokens("self.cache.get(key)") == ["self", "cache", "get", "cache.get", "key"]
    assert plain.tokens("self.x") == ["self", "x"]


def test_punctuation_around_names_is_ignored():
    plain = Analyzer(stemmer=None)
    assert plain.tokens("(os.path.join), `os.path.join`. os.path.join!") == \
        ["os", "path", "join", "os.path.join"] * 3
    assert plain.tokens("«quoted» end.") == ["quoted", "end"]


def test_names_spelled_in_punctuation_stay_searchable_terms():
    plain = Analyzer(stemmer=None)
    # Each is one term, the one its spelled-out forms give, never the bare letter.
    assert plain.tokens("C++ c++ C++17 (C++), C/C++") == ["cpp", "cpp", "cpp", "17", "cpp", "c", "cpp"]
    assert plain.tokens("CMAKE_CXX_STANDARD foo.cxx cplusplus") == \
        ["cmake", "cpp", "standard", "cmake_cxx_standard", "foo", "cpp", "foo.cxx", "cpp"]
    assert plain.tokens("C# F# .NET 8, C#/.NET") == ["csharp", "fsharp", "dotnet", "8", "csharp", "dotnet"]
    assert plain.tokens("Node.js ASP.NET") == ["node", "js", "node.js", "asp", "net", "asp.net"]
    # Elsewhere "+" and "#" are punctuation, as before.
    assert plain.tokens("j++ x+=1 abc++ y+b #include issue #12 ##") == \
        ["j", "x", "1", "abc", "y", "b", "include", "issue", "12"]
    # The same inside CJK text, and for a query as for a document.
    assert plain.tokens("C++の標準") == ["cpp", "の標", "標準"]
    assert plain.query_tokens("set the C++ standard to 17") == ["set", "cpp", "standard", "17"]


def test_a_question_naming_cpp_finds_the_cmake_variable():
    chunks = [
        "set(CMAKE_CXX_STANDARD 17)\nset(CMAKE_CXX_STANDARD_REQUIRED ON)",
        "For C sources set the C standard: set(CMAKE_C_STANDARD 17) selects C17.",
        "Set the standard output of the build to a log file with a standard name.",
        "C# projects target .NET 8 by default; the SDK picks the version.",
        "The net version of a C project: use a network share for the C compiler.",
    ]
    an = Analyzer()
    index = BM25Index.build(an.tokens_many(chunks))
    assert index.search(an.query_tokens("set the C++ standard to 17"))[0][0] == 0
    assert index.search(an.query_tokens("which .NET version do C# projects use"))[0][0] == 3


def test_stopwords_default_custom_and_off():
    assert Analyzer(stemmer=None).tokens("The cat is on the mat") == ["cat", "mat"]
    # Negations and quantifiers carry meaning in questions about code.
    assert Analyzer(stemmer=None).tokens("not all") == ["not", "all"]
    assert Analyzer(stopwords=False, stemmer=None).tokens("the cat") == ["the", "cat"]
    assert Analyzer(stopwords={"cat"}, stemmer=None).tokens("the cat") == ["the"]


def test_case_folding_and_unicode_normalisation():
    plain = Analyzer(stemmer=None)
    assert plain.tokens("ＨＥＬＬＯ Wörld") == ["hello", "wörld"]   # full-width -> ASCII
    assert plain.tokens("Straße") == ["strasse"]
    assert plain.tokens("\ufb01le") == ["file"]                     # the "fi" ligature
    assert Analyzer().tokens("Running") == ["run"]


def test_cjk_runs_become_bigrams():
    an = Analyzer(stemmer=None)
    assert an.tokens("東京都に住む") == ["東京", "京都", "都に", "に住", "住む"]
    assert an.tokens("は") == ["は"]
    assert an.tokens("Python是一种语言") == ["python", "是一", "一种", "种语", "语言"]
    assert an.tokens("한국어") == ["한국", "국어"]
    assert Analyzer(cjk_bigrams=False).tokens("東京都") == ["東京都"]


def test_query_tokens_drop_repeats_in_order():
    an = Analyzer(stemmer=None)
    assert an.query_tokens("cache the cache, then cache.get") == ["cache", "get", "cache.get"]


def test_query_tokens_are_the_tokens_without_repeats_on_any_text():
    # query_tokens analyzes each distinct word once; the terms must be what
    # deduplicating every word's terms gives, first-seen order included.
    rng = random.Random(20)
    words = ["cache", "Cache", "caching", "cache.get", "get", "os.path.join", "C++", "C#", ".NET",
             "parseHTTPResponse", "snake_case", "utf8", "std::fs", "the", "東京都", "naïve", "«x»",
             "a—b", "src/app.py", "17", "x+y", ",", "..", "end.", "\u00e9"]
    for _ in range(3000):
        text = "".join(rng.choice(words) + rng.choice([" ", "  ", "\n", ", ", "/", ""])
                       for _ in range(rng.randrange(12)))
        an = Analyzer()
        expected = list(dict.fromkeys(Analyzer().tokens(text)))
        assert an.query_tokens(text) == expected, text
        assert an.query_tokens(text) == expected, text   # from the word cache this time


def test_tokens_many_and_cache_do_not_change_results():
    texts = ["def parseHTTPResponse(self, raw):", "The parser reads responses.",
             "self.parser.feed(data)", "東京 parse", ""] * 3
    fresh = [Analyzer().tokens(t) for t in texts]
    assert Analyzer().tokens_many(texts) == fresh
    backwards = Analyzer()
    assert [backwards.tokens(t) for t in reversed(texts)][::-1] == fresh
    backwards.clear_cache()
    assert [backwards.tokens(t) for t in texts] == fresh


def test_split_identifiers_off_keeps_words_whole():
    an = Analyzer(stemmer=None, split_identifiers=False)
    assert an.tokens("parseHTTPResponse os.path.join foo_bar") == [
        "parsehttpresponse", "os", "path", "join", "foo_bar"]


def test_unknown_stemmer_is_an_error():
    with pytest.raises(ValueError, match="stemmer"):
        Analyzer(stemmer="lancaster")
