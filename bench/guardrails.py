#!/usr/bin/env python3
"""What screening retrieved context costs one request: redaction, then the poisoning guard.

    python bench/guardrails.py                   # README.md's own chunks, 400 requests of 5 chunks
    python bench/guardrails.py --requests 2000 --top-k 8 --ragproxy /tmp/try/ragproxy.py

The chunks are a real document's (this repository's README.md, cut by
ragproxy's chunker with its defaults); each request screens ``--top-k`` of
them, picked by a seeded random generator, as retrieval's guardrails do:
every category of ``redact.Redactor``, then ``guard.Guard.scan`` with one deny
pattern.  Printed: the per-request time (p50, p95), the per-chunk time of each
step measured apart, and how many of the chunks the guard flags at its default
min_confidence (ordinary documentation: it should be none).  Guardrails are off
by default, so this is what turning them on adds, never what every request pays.

Output: a readable summary, then one JSON line.  Standard library only; Python 3.9+.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=400, help="requests to time (default 400)")
    parser.add_argument("--top-k", type=int, default=5, help="chunks screened per request (default 5)")
    parser.add_argument("--document", default=os.path.join(ROOT, "README.md"), help="the document to chunk")
    parser.add_argument("--ragproxy", default=os.path.join(ROOT, "ragproxy.py"),
                        help="the ragproxy.py whose _ragproxy package is measured")
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.ragproxy)))
    from _ragproxy import guard, redact
    from _ragproxy.chunking import chunk_document
    from _ragproxy.documents import extract

    with open(args.document, "rb") as f:
        data = f.read()
    chunks = [c.text for doc in extract(os.path.basename(args.document), data) for c in chunk_document(doc)]
    if len(chunks) < args.top_k:
        parser.error(f"{args.document} gives {len(chunks)} chunks, fewer than --top-k {args.top_k}")
    rng = random.Random(args.seed)
    screen, redactor = guard.Guard(deny_patterns=(r"(?i)kettle is broken",)), redact.Redactor()
    clock = time.perf_counter
    per_request = []
    for _ in range(args.requests):
        batch = rng.sample(chunks, args.top_k)
        started = clock()
        for text in batch:
            text, _ = redactor.redact(text)
            screen.scan(text)
        per_request.append((clock() - started) * 1000)
    per_request.sort()
    started = clock()
    for text in chunks:
        redactor.redact(text)
    redact_ms = (clock() - started) * 1000 / len(chunks)
    started = clock()
    flagged = sum(1 for text in chunks if any(f.confidence >= guard.DEFAULT_MIN_CONFIDENCE for f in screen.scan(text)))
    guard_ms = (clock() - started) * 1000 / len(chunks)
    result = {"chunks": len(chunks), "mean_chars": round(sum(map(len, chunks)) / len(chunks)),
              "requests": args.requests, "top_k": args.top_k,
              "request_p50_ms": round(per_request[len(per_request) // 2], 3),
              "request_p95_ms": round(per_request[int(len(per_request) * 0.95)], 3),
              "redact_ms_per_chunk": round(redact_ms, 3), "guard_ms_per_chunk": round(guard_ms, 3),
              "flagged": flagged, "min_confidence": guard.DEFAULT_MIN_CONFIDENCE}
    print(f"{result['chunks']} chunks of {os.path.basename(args.document)}, mean {result['mean_chars']} chars")
    print(f"screening {args.top_k} chunks (redaction, all categories, then the guard with one deny pattern): "
          f"p50 {result['request_p50_ms']:.2f} ms, p95 {result['request_p95_ms']:.2f} ms per request")
    print(f"per chunk: redact {redact_ms:.3f} ms, guard {guard_ms:.3f} ms")
    print(f"chunks the guard flags at min_confidence {guard.DEFAULT_MIN_CONFIDENCE}: {flagged}/{len(chunks)}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
