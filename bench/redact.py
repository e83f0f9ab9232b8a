#!/usr/bin/env python3
"""Redaction (``_ragproxy.redact``): what it takes from ordinary text, what it catches, how fast.

    python bench/redact.py                       # SciFact + CoSQA from ../shared/eval, CPython's pydoc topics
    python bench/redact.py --show 5              # and up to 5 redactions per corpus and category, in context
    python bench/redact.py --stdlib              # also CPython's own Lib/*.py (code), in 1,500-character chunks
    python bench/redact.py --eval-dir DIR --repeat 5 --ragproxy /tmp/try/ragproxy.py

* **Ordinary corpora** (false positives): every document of SciFact's and
  CoSQA's ``corpus.jsonl`` (title and text, as imported) and every topic of
  ``pydoc_data.topics`` (the CPython docs' help texts) is redacted with every
  category on; the table gives, per corpus, the redactions per category and
  the share of documents with any.  Most categories should be 0 there; a
  non-zero figure is read with ``--show`` (SciFact abstracts, for one, carry
  their authors' real e-mail addresses and phone numbers: a true positive).
  ``--stdlib`` adds a code corpus: the standard library's ``Lib/*.py`` and
  ``Lib/*/*.py`` of the Python running the bench, cut every 1,500 characters.
* **Labelled set** (recall and precision): tests/data/redact/labelled.txt,
  fake secrets in code, config and prose plus look-alikes that must stay.
  Per category: found/expected redactions (TP, FP, FN by counts per case) and
  the cases whose whole output is exactly the expected one.  The patterns
  were tuned on that file; ``--labelled tests/data/redact/heldout.txt`` runs
  the cases written after them instead.
* **Throughput**: MB/s of UTF-8 input per corpus, the best of ``--repeat``
  runs (one Redactor, all categories).

Output: a readable table, then one JSON line.  Standard library only (plus
what ragproxy itself uses); Python 3.9+.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

from perf import load_ragproxy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RAGPROXY = os.path.join(ROOT, "ragproxy.py")
SHARED_EVAL = os.path.join(os.path.dirname(ROOT), "shared", "eval")
LABELLED = os.path.join(ROOT, "tests", "data", "redact", "labelled.txt")
MARK = re.compile(r"⟦([a-z_]+):(.*?)⟧", re.S)
PLACED = re.compile(r"\[REDACTED:([a-z_]+)\]")


def read_corpus(folder):
    """The documents of a BEIR ``corpus.jsonl`` as the importer sees them: title, newline, text."""
    docs = []
    with open(os.path.join(folder, "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                docs.append(((d.get("title") or "") + "\n" + (d.get("text") or "")).strip())
    return docs


def read_labelled(path):
    """``[(kind, name, text, expected, {category: n})]``; the format is described in the file's header."""
    with open(path, encoding="utf-8") as f:
        parts = re.split(r"^## (positive|negative): (.*)\n", f.read(), flags=re.M)
    cases = []
    for i in range(1, len(parts), 3):
        kind, name, body = parts[i], parts[i + 1], parts[i + 2]
        counts = collections.Counter(m.group(1) for m in MARK.finditer(body))
        cases.append((kind, name, MARK.sub(lambda m: m.group(2), body),
                      MARK.sub(lambda m: "[REDACTED:%s]" % m.group(1), body), dict(counts)))
    return cases


def read_stdlib(size=1500):
    """CPython's own Lib/*.py and Lib/*/*.py in ``size``-character pieces (a code corpus with real addresses)."""
    import glob
    base = os.path.dirname(os.__file__)
    docs = []
    for path in sorted(glob.glob(os.path.join(base, "*.py")) + glob.glob(os.path.join(base, "*", "*.py"))):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        docs.extend(text[i:i + size] for i in range(0, len(text), size))
    return docs


def scan_corpus(redactor, docs, repeat, show):
    size = sum(len(d.encode("utf-8")) for d in docs)
    best = None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        results = [redactor.redact(d) for d in docs]
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    totals, touched, examples = collections.Counter(), 0, collections.defaultdict(list)
    for out, counts in results:
        totals.update(counts)
        touched += bool(counts)
        if show and counts:
            for m in PLACED.finditer(out):
                if len(examples[m.group(1)]) < show:
                    examples[m.group(1)].append(out[max(0, m.start() - 60):m.end() + 30].replace("\n", " "))
    return {"docs": len(docs), "mb": size / 1e6, "mb_per_s": size / 1e6 / best if best else 0.0,
            "redactions": dict(totals), "docs_with_redaction": touched,
            "share_with_redaction": touched / len(docs) if docs else 0.0, "examples": dict(examples)}


def score_labelled(redactor, cases, categories, repeat):
    per = {c: {"tp": 0, "fp": 0, "fn": 0} for c in categories}
    exact = 0
    for _, _, text, expected, want in cases:
        out, got = redactor.redact(text)
        exact += out == expected
        for c in categories:
            g, w = got.get(c, 0), want.get(c, 0)
            per[c]["tp"] += min(g, w)
            per[c]["fp"] += max(0, g - w)
            per[c]["fn"] += max(0, w - g)
    for c, s in per.items():
        s["precision"] = s["tp"] / (s["tp"] + s["fp"]) if s["tp"] + s["fp"] else None
        s["recall"] = s["tp"] / (s["tp"] + s["fn"]) if s["tp"] + s["fn"] else None
    docs = [text for _, _, text, _, _ in cases]
    size = sum(len(d.encode("utf-8")) for d in docs)
    best = min(_timed(redactor, docs) for _ in range(max(1, repeat)))
    return {"cases": len(cases), "positive": sum(k == "positive" for k, *_ in cases),
            "negative": sum(k == "negative" for k, *_ in cases), "exact": exact, "per_category": per,
            "mb_per_s": size / 1e6 / best if best else 0.0}


def _timed(redactor, docs):
    start = time.perf_counter()
    for d in docs:
        redactor.redact(d)
    return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval-dir", default=SHARED_EVAL, metavar="DIR",
                   help="folder holding scifact/ and cosqa-dev/ (default: ../shared/eval)")
    p.add_argument("--labelled", default=LABELLED, metavar="FILE", help="the labelled cases (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="timing runs per corpus, best kept (default: 3)")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print up to N redactions per corpus and category")
    p.add_argument("--stdlib", action="store_true", help="also scan CPython's Lib/*.py (1,500-character chunks)")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH", help="the ragproxy.py to measure")
    args = p.parse_args(argv)

    load_ragproxy(args.ragproxy)
    from _ragproxy import redact

    redactor = redact.Redactor()
    corpora = []
    for name in ("scifact", "cosqa-dev"):
        folder = os.path.join(args.eval_dir, name)
        if os.path.exists(os.path.join(folder, "corpus.jsonl")):
            corpora.append((name, read_corpus(folder)))
        else:
            print("skipped %s: no %s" % (name, os.path.join(folder, "corpus.jsonl")), file=sys.stderr)
    try:
        from pydoc_data.topics import topics
        corpora.append(("pydoc-topics", list(topics.values())))
    except ImportError:
        print("skipped pydoc-topics: this Python has no pydoc_data", file=sys.stderr)
    if args.stdlib:
        corpora.append(("cpython-lib", read_stdlib()))

    report = {"python": sys.version.split()[0], "categories": list(redact.CATEGORIES), "corpora": {}}
    cats = redact.CATEGORIES
    print("Ordinary corpora: redactions per category (all categories on)")
    print("%-13s %6s %7s %7s  %s" % ("corpus", "docs", "MB", "MB/s", "  ".join(c[:10] for c in cats)))
    for name, docs in corpora:
        r = scan_corpus(redactor, docs, args.repeat, args.show)
        report["corpora"][name] = r
        print("%-13s %6d %7.2f %7.2f  %s   docs with any: %d (%.2f%%)" % (
            name, r["docs"], r["mb"], r["mb_per_s"],
            "  ".join("%*d" % (len(c[:10]), r["redactions"].get(c, 0)) for c in cats),
            r["docs_with_redaction"], 100 * r["share_with_redaction"]))
        for category, lines in r["examples"].items():
            for line in lines:
                print("    %-17s %s" % (category, line))

    lab = score_labelled(redactor, read_labelled(args.labelled), cats, args.repeat)
    report["labelled"] = lab
    print()
    print("Labelled set %s: %d cases (%d positive, %d negative), %d with exactly the expected output; %.2f MB/s"
          % (os.path.relpath(args.labelled, ROOT), lab["cases"], lab["positive"], lab["negative"], lab["exact"],
             lab["mb_per_s"]))
    print("%-18s %4s %4s %4s %9s %7s" % ("category", "TP", "FP", "FN", "precision", "recall"))
    for c in cats:
        s = lab["per_category"][c]
        print("%-18s %4d %4d %4d %9s %7s" % (c, s["tp"], s["fp"], s["fn"],
                                             "-" if s["precision"] is None else "%.3f" % s["precision"],
                                             "-" if s["recall"] is None else "%.3f" % s["recall"]))
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
