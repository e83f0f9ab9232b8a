#!/usr/bin/env python3
"""Retrieval quality of ragproxy on a BEIR-layout test collection.

    python bench/eval_retrieval.py ../shared/eval/scifact                 # lexical, test split
    python bench/eval_retrieval.py ../shared/eval/cosqa-dev --split dev
    python bench/eval_retrieval.py ../shared/eval/scifact --k1 0.9 --b 0.4
    python bench/eval_retrieval.py ../shared/eval/scifact --mode dense,hybrid --start-embed-server
    python bench/eval_retrieval.py ../shared/eval/scifact --mode hybrid --embed-url http://127.0.0.1:8200/v1

COLLECTION_DIR holds ``corpus.jsonl`` ({_id, title, text} per line),
``queries.jsonl`` ({_id, text}) and ``qrels/<split>.tsv`` (header, then
``query-id  corpus-id  score``).

What runs is ragproxy's own code path: a config with one knowledge base
("bench") is written into a fresh data directory, the corpus goes in through
``ragproxy.py import`` (``ragproxy.main``, in this process), and every judged
query is answered by ``KnowledgeBase.search``, the call the proxy makes for a
request.  ragproxy chunks documents, so a hit is a chunk whose source is
``bench/corpus.jsonl#<doc id>``; the ranking scored here keeps each
document's best-ranked chunk (later chunks of the same document are dropped),
and the search is repeated deeper until ``--top-k`` distinct documents are
found or the collection is exhausted.

Metrics follow trec_eval: nDCG@10 with graded gain (the qrels score) and a
log2(rank + 1) discount, the ideal DCG from the judgments; Recall@100 and
MRR@10 count a document as relevant when its score is >= 1.  Queries whose
judgments are all zero are skipped; a judged query with no hits scores 0.
Hits keep ragproxy's order (ties are not re-sorted by document id as
trec_eval would).

Output: a readable table, then one JSON line per mode (the last lines).
Dense and hybrid need an OpenAI-compatible /v1/embeddings server
(``--embed-url``), or ``--start-embed-server`` to run bench/embed_server.py
(sentence-transformers all-MiniLM-L6-v2; see bench/README.md).

Standard library only (plus what ragproxy itself uses); Python 3.9+.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time

from perf import load_ragproxy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RAGPROXY = os.path.join(ROOT, "ragproxy.py")
KB_NAME = "bench"
MODES = ("lexical", "dense", "hybrid")

# Public names: read_beir, ndcg_at_k, recall_at_k, mrr_at_k, evaluate,
#   best_rank_per_document, doc_id_of, run_eval, main


# --------------------------------------------------------------------------
# Metrics (trec_eval definitions)


def ndcg_at_k(ranked, judgments, k=10):
    """nDCG@k of ``ranked`` (document ids, best first) against ``{doc_id: score}``.

    Gain is the judgment score (0 for unjudged or non-positive), discounted by
    log2(rank + 1); the ideal ranking sorts the positive judgments descending.
    """
    ideal = sorted((g for g in judgments.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    if idcg == 0:
        return 0.0
    dcg = 0.0
    for i, doc in enumerate(ranked[:k]):
        gain = judgments.get(doc, 0)
        if gain > 0:
            dcg += gain / math.log2(i + 2)
    return dcg / idcg


def recall_at_k(ranked, judgments, k=100):
    """Share of the relevant documents (score >= 1) found in the first ``k``."""
    relevant = {d for d, g in judgments.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at_k(ranked, judgments, k=10):
    """1 / rank of the first relevant document within the first ``k``, else 0."""
    for i, doc in enumerate(ranked[:k]):
        if judgments.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def evaluate(run, qrels):
    """Mean nDCG@10, Recall@100 and MRR@10 of ``run`` ({qid: [doc ids]}).

    Averaged over the queries of ``qrels`` ({qid: {doc: score}}) that have a
    positive judgment; a query missing from ``run`` counts as retrieving
    nothing.  Returns ``(means, per_query)``.
    """
    per_query = {}
    for qid, judgments in qrels.items():
        if not any(g > 0 for g in judgments.values()):
            continue
        ranked = run.get(qid, [])
        per_query[qid] = {"ndcg@10": ndcg_at_k(ranked, judgments, 10),
                          "recall@100": recall_at_k(ranked, judgments, 100),
                          "mrr@10": mrr_at_k(ranked, judgments, 10)}
    n = len(per_query)
    means = {m: (sum(q[m] for q in per_query.values()) / n if n else 0.0)
             for m in ("ndcg@10", "recall@100", "mrr@10")}
    return means, per_query


def best_rank_per_document(doc_ids):
    """Document ids in first-seen order: each document at its best chunk's rank."""
    return list(dict.fromkeys(doc_ids))


# --------------------------------------------------------------------------
# Collection


def read_beir(collection_dir, split="test"):
    """``(corpus_path, queries {qid: text}, qrels {qid: {doc: score}})``."""
    corpus = os.path.join(collection_dir, "corpus.jsonl")
    qrels_path = os.path.join(collection_dir, "qrels", split + ".tsv")
    for path in (corpus, os.path.join(collection_dir, "queries.jsonl"), qrels_path):
        if not os.path.isfile(path):
            raise SystemExit(f"eval_retrieval: {path} not found (BEIR layout: corpus.jsonl, queries.jsonl, "
                             f"qrels/<split>.tsv)")
    queries = {}
    with open(os.path.join(collection_dir, "queries.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                queries[str(obj["_id"])] = obj["text"]
    qrels = {}
    with open(qrels_path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or (n == 0 and not parts[2].lstrip("-").isdigit()):
                continue  # the header, or a blank line
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return corpus, queries, qrels


def slice_corpus(corpus_path, keep_ids, limit_docs, out_path):
    """Write the judged documents plus the first others, ``limit_docs`` in all."""
    kept = 0
    with open(corpus_path, encoding="utf-8") as src, open(out_path, "w", encoding="utf-8") as dst:
        for line in src:
            if not line.strip():
                continue
            doc_id = str(json.loads(line)["_id"])
            if doc_id in keep_ids or kept < limit_docs - len(keep_ids):
                dst.write(line if line.endswith("\n") else line + "\n")
                kept += doc_id not in keep_ids
    return out_path


def _count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


# --------------------------------------------------------------------------
# ragproxy


def write_config(path, args, embed_url):
    """A config with the one knowledge base; values are JSON, which the YAML subset reads."""
    q = json.dumps
    lines = [
        "server: {host: 127.0.0.1, port: 0}",
        "api_key_auth: false",
        "providers:",
        "  llm: {}",
    ]
    if embed_url:
        lines += ["  embedding:",
                  f"    bench: {{type: openai, base_url: {q(embed_url)}, model: {q(args.embed_model)}, "
                  f"batch_size: {args.embed_batch_size}, max_concurrency: 1, read_timeout: 600}}"]
    lines += [
        "models: []",
        "knowledge_bases:",
        f"  {KB_NAME}:",
        f"    retrieval: {'hybrid' if embed_url else 'lexical'}",
    ]
    if embed_url:
        lines.append("    embedding: bench")
    lines += [
        f"    chunking: {{strategy: {args.strategy}, chunk_size: {args.chunk_size}, "
        f"chunk_overlap: {args.chunk_overlap}}}",
        f"    bm25: {{k1: {args.k1}, b: {args.b}}}",
        f"    weights: {{lexical: {args.lexical_weight}, dense: {args.dense_weight}}}",
        "    max_file_bytes: 1073741824",
    ]
    if args.compact:
        lines.append(f"    compact: {args.compact}")
    if args.fusion:
        lines.append(f"    fusion: {args.fusion}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def doc_id_of(source, prefix):
    """The corpus id in a chunk source ``<prefix>#<id>`` (None for another source)."""
    head, sep, doc_id = source.partition("#")
    return doc_id if sep and head == prefix else None


def _percentile(values, p):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def _save_run(path, run, mode):
    """A TREC run file; the score column is (N + 1 - rank), so trec_eval keeps ragproxy's order."""
    with open(path, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            for rank, doc in enumerate(docs, 1):
                f.write(f"{qid} Q0 {doc} {rank} {len(docs) + 1 - rank} ragproxy-{mode}\n")


@contextlib.contextmanager
def _embed_server(args):
    """bench/embed_server.py on a free loopback port; yields its /v1 URL."""
    import embed_server
    with embed_server.started(args.embed_model_path, "eval_retrieval") as url:
        print(f"embedding server: {url}", file=sys.stderr)
        yield url


def run_eval(args, embed_url=None):
    """Ingest, search and score; returns one result dict per mode."""
    if args.pure:
        os.environ["RAGPROXY_PURE"] = "1"
    ragproxy = load_ragproxy(args.ragproxy)
    corpus_path, queries, qrels = read_beir(args.collection, args.split)
    judged = [qid for qid in queries if any(g > 0 for g in qrels.get(qid, {}).values())]
    missing = [qid for qid in qrels if qid not in queries]
    if missing:
        print(f"warning: {len(missing)} judged queries are not in queries.jsonl; skipped", file=sys.stderr)
    if args.limit_queries:
        judged = judged[:args.limit_queries]
    qrels = {qid: qrels[qid] for qid in judged}

    own_dir = args.data_dir is None
    data_dir = tempfile.mkdtemp(prefix="ragproxy-eval-") if own_dir else os.path.abspath(args.data_dir)
    try:
        os.makedirs(os.path.join(data_dir, "config"), exist_ok=True)
        # A kept data dir keeps its embedding cache, but the KB is rebuilt:
        # changed chunking settings do not re-chunk unchanged files.
        for sub in ("vectordb", "documents"):
            shutil.rmtree(os.path.join(data_dir, sub, KB_NAME), ignore_errors=True)
        if args.limit_docs:
            keep = {d for qid in judged for d in qrels[qid]}
            corpus_path = slice_corpus(corpus_path, keep, args.limit_docs,
                                        os.path.join(data_dir, "corpus.jsonl"))
        n_docs = _count_lines(corpus_path)
        config_path = os.path.join(data_dir, "config", "config.yaml")
        write_config(config_path, args, embed_url)
        argv = ["import", KB_NAME, corpus_path, "--data-dir", data_dir, "--config", config_path,
                "--log-level", "WARNING"]
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):   # keep stdout for the results
            status = ragproxy.main(argv)
        ingest_s = time.perf_counter() - started
        if status != 0:
            raise SystemExit(f"eval_retrieval: ragproxy import failed (exit {status})")

        config = ragproxy.Config.load(config_path)
        kbs = ragproxy.KnowledgeBases(config, data_dir, ragproxy.make_http_pool())
        kb = kbs.get(KB_NAME)
        generation, _ = kb.current()
        n_chunks = len(generation)
        prefix = f"{KB_NAME}/{os.path.basename(corpus_path)}"
        results = []
        # Enough chunks for top_k documents on average; deeper only when not.
        first_depth = min(n_chunks, args.top_k * max(1, -(-n_chunks // max(1, n_docs))))
        for mode in args.modes:
            run, latencies, deeper = {}, [], 0
            for qid in judged:
                depth, docs = first_depth, []
                t0 = time.perf_counter()
                while True:
                    hits = kb.search(queries[qid], depth, mode=mode)
                    docs = best_rank_per_document(
                        [doc_id_of(h.chunk["source"], prefix) for h in hits])
                    if len(docs) >= args.top_k or len(hits) < depth or depth >= n_chunks:
                        break
                    depth = min(n_chunks, depth * 2)
                    deeper += 1
                latencies.append(time.perf_counter() - t0)
                if None in docs:
                    raise SystemExit(f"eval_retrieval: a hit did not come from {prefix}#<id>")
                run[qid] = docs[:args.top_k]
            # What the proxy asks for: the best 10 chunks (a dense query's
            # vector is memoized by now, so this is the search alone).
            search10 = []
            for qid in judged:
                t0 = time.perf_counter()
                kb.search(queries[qid], 10, mode=mode)
                search10.append(time.perf_counter() - t0)
            means, _ = evaluate(run, qrels)
            if args.save_run:
                _save_run(args.save_run if len(args.modes) == 1 else f"{args.save_run}.{mode}", run, mode)
            results.append({
                "collection": os.path.basename(os.path.normpath(args.collection)), "split": args.split,
                "mode": mode, "queries": len(judged), "docs": n_docs, "chunks": n_chunks,
                **{k: round(v, 4) for k, v in means.items()},
                "ingest_s": round(ingest_s, 2),
                "query_p50_ms": round(_percentile(latencies, 50) * 1000, 2),
                "query_p99_ms": round(_percentile(latencies, 99) * 1000, 2),
                "search10_p50_ms": round(_percentile(search10, 50) * 1000, 3),
                "first_depth": first_depth, "deeper_searches": deeper,
                "dedupe": "best chunk per document",
                "params": {"k1": args.k1, "b": args.b, "strategy": args.strategy, "chunk_size": args.chunk_size,
                           "chunk_overlap": args.chunk_overlap, "top_k": args.top_k,
                           "lexical_weight": args.lexical_weight, "dense_weight": args.dense_weight,
                           "compact": args.compact or None, "fusion": args.fusion or "default",
                           "embed_model": args.embed_model if mode != "lexical" else None},
                "ragproxy": ragproxy.version_text(),
            })
        kbs.stop()
        return results
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def print_table(results, out=sys.stdout):
    if not results:
        return
    r0 = results[0]
    print(f"{r0['collection']} {r0['split']}: {r0['queries']} judged queries, {r0['docs']} documents -> "
          f"{r0['chunks']} chunks (ingest {r0['ingest_s']:.1f} s); {r0['ragproxy']}", file=out)
    print("ranking: ragproxy KnowledgeBase.search; each document at its best chunk's rank "
          "(later chunks of a document dropped)", file=out)
    print(f"latency: p50/p99 per query at depth {r0['first_depth']} chunks (deeper when fewer than "
          f"top-k documents came back), and p50 of search(top_k=10) as the proxy asks", file=out)
    head = ("mode", "nDCG@10", "R@100", "MRR@10", "p50 ms", "p99 ms", "top10 p50 ms")
    rows = [(r["mode"], f"{r['ndcg@10']:.4f}", f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}",
             f"{r['query_p50_ms']:.2f}", f"{r['query_p99_ms']:.2f}", f"{r['search10_p50_ms']:.2f}")
            for r in results]
    widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
    for row in [head] + rows:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))),
              file=out)


def _parse_args(argv):
    p = argparse.ArgumentParser(description="nDCG@10 / Recall@100 / MRR@10 of ragproxy on a BEIR collection.")
    p.add_argument("collection", metavar="COLLECTION_DIR")
    p.add_argument("--split", default="test", help="qrels/<split>.tsv (default test)")
    p.add_argument("--mode", default="lexical",
                   help="lexical, dense or hybrid; comma-separated for several on one ingest (default lexical)")
    p.add_argument("--top-k", type=int, default=100, help="documents ranked per query (default 100)")
    p.add_argument("--k1", type=float, default=1.2, help="BM25 k1 (knowledge_bases.*.bm25.k1, default 1.2)")
    p.add_argument("--b", type=float, default=0.75, help="BM25 b (default 0.75)")
    p.add_argument("--strategy", default="auto", choices=("auto", "token", "paragraph", "heading", "code"),
                   help="chunking strategy (default auto)")
    p.add_argument("--chunk-size", type=int, default=256, help="chunk size in estimated tokens (default 256)")
    p.add_argument("--chunk-overlap", type=int, default=32, help="chunk overlap (default 32)")
    p.add_argument("--lexical-weight", type=float, default=1.0, help="hybrid fusion weight of BM25 (default 1)")
    p.add_argument("--dense-weight", type=float, default=1.0, help="hybrid fusion weight of vectors (default 1)")
    p.add_argument("--fusion", choices=("zscore", "rrf"), default="",
                   help="knowledge_bases.*.fusion (default: ragproxy's, zscore)")
    p.add_argument("--compact", default="", help="knowledge_bases.*.compact (e.g. float16)")
    p.add_argument("--embed-url", help="OpenAI-compatible embeddings base URL ending in /v1")
    p.add_argument("--start-embed-server", action="store_true",
                   help="run bench/embed_server.py for the duration (needs sentence-transformers)")
    p.add_argument("--embed-model", default="all-MiniLM-L6-v2", help="model name sent to the server")
    p.add_argument("--embed-model-path", help="model directory for --start-embed-server")
    p.add_argument("--embed-batch-size", type=int, default=64, help="texts per embeddings request (default 64)")
    p.add_argument("--limit-queries", type=int, default=0, help="only the first N judged queries")
    p.add_argument("--limit-docs", type=int, default=0,
                   help="only N documents: those judged for the selected queries, then the first others")
    p.add_argument("--save-run", metavar="FILE", help="also write the ranking as a TREC run file "
                   "(FILE.<mode> for several modes)")
    p.add_argument("--data-dir", help="data directory to use and keep (default: a temporary one, removed)")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH", help="ragproxy.py to measure (default: "
                   "the checkout's)")
    p.add_argument("--pure", action="store_true", help="RAGPROXY_PURE=1: the stdlib-only code paths")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--mode takes {', '.join(MODES)} (got {args.mode!r})")
    if any(m != "lexical" for m in args.modes) and not (args.embed_url or args.start_embed_server):
        p.error("dense and hybrid need --embed-url or --start-embed-server")
    if args.top_k < 1:
        p.error("--top-k must be >= 1")
    return args


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.start_embed_server:
        with _embed_server(args) as url:
            results = run_eval(args, url)
    else:
        results = run_eval(args, args.embed_url)
    print_table(results)
    for r in results:
        print(json.dumps(r, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
