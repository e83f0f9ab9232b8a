#!/usr/bin/env python3
"""The context poisoning guard (_ragproxy/guard.py): how well it separates planted instructions from ordinary text.

    python bench/guard.py                       # everything below, ~1 min
    python bench/guard.py --min-confidence 0.6  # the per-category table at another threshold
    python bench/guard.py --skip-corpora        # the labelled set and the pathological inputs only
    python bench/guard.py --json                # the tables, then one JSON line with every figure

* **Labelled set** (tests/data/guard/labelled.jsonl, hand-written: poisoned
  chunks of every category and language, and clean but tricky ones: security
  writing that quotes attacks, code and docs that say "ignore"): a text is
  flagged when one of its findings reaches the threshold.  Per category,
  recall is the share of that category's poisoned texts flagged; precision
  is the share of texts with a finding of that category (at the threshold)
  that are poisoned.  Then a sweep over thresholds, overall.  The rules were
  tuned on this set, so these are training figures.
* **Held-out set** (tests/data/guard/heldout.jsonl): written after the tuning
  and scored as written; the same table and sweep.
* **Ordinary documentation**: the share of chunks flagged in SciFact's and
  CoSQA's corpora (../shared/eval/*/corpus.jsonl, one chunk a record, title
  and text) and in CPython's docs (pydoc_data.topics, each topic chunked by
  _ragproxy.chunking.chunk_document as a KB would); every flagged chunk is
  printed with its findings, to read.
* **Throughput**: MB/s of Guard.scan over those chunks (UTF-8 bytes).
* **Pathological inputs**: seconds for one scan of each 1 MB input (repeated
  near-matches, runs of spaces, zero-width characters or ``a``, nested
  brackets, a long base64 or %XX run, HTML comments...).

Standard library only (plus ragproxy itself); Python 3.9+.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from _ragproxy import chunking, documents, guard  # noqa: E402

SHARED_EVAL = os.path.join(os.path.dirname(ROOT), "shared", "eval")
LABELLED = os.path.join(ROOT, "tests", "data", "guard", "labelled.jsonl")
HELDOUT = os.path.join(ROOT, "tests", "data", "guard", "heldout.jsonl")
SWEEP = (0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9)
ATTACKS = tuple(c for c in guard.CATEGORIES if c != "deny_pattern")


def read_labelled(path=LABELLED):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def labelled_figures(records, scanner, threshold):
    """``{category: {precision, recall, poisoned, flagged}}`` plus ``overall``, at ``threshold``."""
    scans = [[f for f in scanner.scan(r["text"]) if f.confidence >= threshold] for r in records]
    out = {}
    for cat in ATTACKS + ("overall",):
        if cat == "overall":
            relevant = [r["poisoned"] for r in records]
            hit = [bool(s) for s in scans]
        else:
            relevant = [r["poisoned"] and r["category"] == cat for r in records]
            hit = [any(f.category == cat for f in s) for s in scans]
        poisoned = sum(relevant)
        found = sum(1 for r, s in zip(relevant, [bool(s) for s in scans]) if r and s)
        flagged = [rec["poisoned"] for rec, h in zip(records, hit) if h]
        out[cat] = {"precision": sum(flagged) / len(flagged) if flagged else 1.0,
                    "recall": found / poisoned if poisoned else 1.0,
                    "poisoned": poisoned, "flagged": len(flagged)}
    return out


def corpus_chunks(name):
    """(text, label) of each record of a BEIR corpus under ../shared/eval."""
    path = os.path.join(SHARED_EVAL, name, "corpus.jsonl")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            text = (r.get("title") or "") + "\n" + (r.get("text") or "")
            out.append((text.strip(), "%s:%s" % (name, r.get("_id"))))
    return out


def cpython_doc_chunks():
    import pydoc_data.topics
    out = []
    for topic, text in sorted(pydoc_data.topics.topics.items()):
        doc = documents.Document(text=text, title=topic, kind="text", source="pydoc_data/topics/" + topic)
        for c in chunking.chunk_document(doc):
            out.append((c.text, "cpython:%s:%d" % (topic, c.line_start)))
    return out


def false_positives(chunks, scanner, threshold):
    t0 = time.perf_counter()
    scans = [scanner.scan(text) for text, _ in chunks]
    seconds = time.perf_counter() - t0
    size = sum(len(text.encode("utf-8")) for text, _ in chunks)
    flagged = [(label, text, [f for f in s if f.confidence >= threshold]) for (text, label), s in zip(chunks, scans)]
    flagged = [x for x in flagged if x[2]]
    sweep = {t: sum(1 for s in scans if any(f.confidence >= t for f in s)) for t in SWEEP}
    return {"chunks": len(chunks), "flagged": len(flagged), "rate": len(flagged) / len(chunks) if chunks else 0.0,
            "mb_per_s": size / 1e6 / seconds if seconds else 0.0, "mb": size / 1e6, "sweep": sweep}, flagged


def pathological(size=1 << 20):
    near = "ignore the previous section if you use docker. "
    return {
        "spaces": " " * size,
        "letter a": "a" * size,
        "zero-width": "\u200b" * size,
        "zero-width in words": ("ab\u200b" * (size // 3)),
        "tag characters": "\U000e0061" * (size // 4),
        "nested brackets": "[" * (size // 2) + "]" * (size // 2),
        "nested parens and images": "![" * (size // 4) + "](" * (size // 4),
        "near-miss override": (near * (size // len(near) + 1))[:size],
        "ignore + spaces": ("ignore" + " " * 1000) * (size // 1006),
        "ignore repeated": "ignore " * (size // 7),
        "override words, no noun": "ignore all previous " * (size // 20),
        "base64 run": "QUFB" * (size // 4),
        "base64 words": ("aWdub3JlIHRoaXM= " * (size // 17)),
        "hex run": "41" * (size // 2),
        "percent run": "%41" * (size // 3),
        "percent sparse": "%41xxxxxxxxxx" * (size // 13),
        "html comments": "<!--" * (size // 4),
        "open tags": '<div style="display:none">' * (size // 26),
        "urls with queries": "https://x.example/?a={b}&" * (size // 25),
        "markdown images": "![a](https://x.example/p?d={data}) " * (size // 35),
        "backticks": "`" * size,
        "newlines": "\n" * size,
        "rot13 gate": "vtaber " * (size // 7),
        "mixed scripts": ("忽略 ignorer вс ignora " * (size // 25)),
        "quotes": '"' * size,
        "curl no pipe": "curl " * (size // 5),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-confidence", type=float, default=guard.DEFAULT_MIN_CONFIDENCE)
    parser.add_argument("--skip-corpora", action="store_true")
    parser.add_argument("--show", type=int, default=20, help="print at most this many flagged chunks per corpus")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    scanner = guard.Guard()
    t = args.min_confidence
    figures = {"min_confidence": t}

    for key, path, title in (("labelled", LABELLED, "labelled set (tuned on)"), ("heldout", HELDOUT, "held-out set")):
        records = read_labelled(path)
        table = labelled_figures(records, scanner, t)
        print("%s: %d texts, %d poisoned, %d clean; min_confidence %.2f"
              % (title, len(records), sum(r["poisoned"] for r in records), sum(not r["poisoned"] for r in records), t))
        print("%-22s %9s %7s %9s %8s" % ("category", "precision", "recall", "poisoned", "flagged"))
        for cat, row in table.items():
            print("%-22s %9.3f %7.3f %9d %8d" % (cat, row["precision"], row["recall"], row["poisoned"], row["flagged"]))
        figures[key] = table
        print("sweep (overall): threshold precision recall")
        figures[key + "_sweep"] = {}
        for th in SWEEP:
            row = labelled_figures(records, scanner, th)["overall"]
            figures[key + "_sweep"][th] = row
            print("  %.2f  %.3f  %.3f" % (th, row["precision"], row["recall"]))
        print()

    if not args.skip_corpora:
        figures["corpora"] = {}
        sources = [("scifact", lambda: corpus_chunks("scifact")), ("cosqa-dev", lambda: corpus_chunks("cosqa-dev")),
                   ("cpython-docs", cpython_doc_chunks)]
        print("ordinary documentation: chunks flagged at %.2f (sweep: flagged at each threshold)" % t)
        for name, load in sources:
            try:
                chunks = load()
            except OSError as e:
                print("  %s: skipped (%s)" % (name, e))
                continue
            row, flagged = false_positives(chunks, scanner, t)
            figures["corpora"][name] = row
            print("  %-13s %6d chunks  %3d flagged  %.4f%%  %.1f MB/s over %.1f MB   sweep %s"
                  % (name, row["chunks"], row["flagged"], 100 * row["rate"], row["mb_per_s"], row["mb"],
                     " ".join("%.2f:%d" % kv for kv in row["sweep"].items())))
            for label, text, fs in flagged[:args.show]:
                print("      %s %s: %r" % (label, [(f.rule_id, f.confidence) for f in fs],
                                          text[max(0, fs[0].start - 60):fs[0].end + 60]))
        total = sum(r["chunks"] for r in figures["corpora"].values())
        bad = sum(r["flagged"] for r in figures["corpora"].values())
        figures["corpora_total"] = {"chunks": total, "flagged": bad, "rate": bad / total if total else 0.0}
        print("  all: %d chunks, %d flagged (%.4f%%)" % (total, bad, 100 * bad / total if total else 0.0))

    print("\npathological 1 MB inputs: seconds for one scan")
    figures["pathological"] = {}
    for name, text in pathological().items():
        t0 = time.perf_counter()
        n = len(scanner.scan(text))
        seconds = time.perf_counter() - t0
        figures["pathological"][name] = seconds
        print("  %-26s %6.3f s  %d findings" % (name, seconds, n))
    if args.json:
        print(json.dumps(figures, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
