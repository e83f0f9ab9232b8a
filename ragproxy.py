#!/usr/bin/env python3
"""ragproxy: a local knowledge-base proxy for LLM coding tools.

Coding tools (Claude Code, Codex CLI, Aider, Continue, Cline, Zed, Open WebUI,
plain OpenAI/Anthropic SDK scripts) point their base URL at ragproxy.  It finds
passages in local knowledge bases, injects them into the request, forwards the
request to the real LLM server and streams the answer back untouched.

Standard library only at import time.  numpy, PyYAML and urllib3 are used
when present (``--version`` says which); ``RAGPROXY_PURE=1`` forces the
stdlib fallbacks.

Usage::

    python ragproxy.py --data-dir ./data            # serve on 127.0.0.1:8100
    python -m ragproxy --data-dir ./data            # the same
    python ragproxy.py --version
    python ragproxy.py serve --host 0.0.0.0 --port 8100 --config my.yaml

This file is the entry point and the public API.  The implementation is the
private package ``_ragproxy`` beside it, one module per job; a name imported
from here is loaded from its module on first use, so ``import ragproxy`` stays
cheap and a command loads only what it needs.
"""
import sys

from _ragproxy import __version__

#: Public name -> the _ragproxy module that defines it.
_EXPORTS = {
    "deps": ("FEATURES",),
    "yamlish": ("YAMLError", "parse_yaml", "load_yaml", "dump_yaml"),
    "defaults": ("DEFAULT_HOST", "DEFAULT_PORT", "DEFAULT_CHUNK_SIZE", "DEFAULT_CHUNK_OVERLAP",
                 "DEFAULT_MAX_BYTES", "BM25_K1", "BM25_B"),
    "config": ("Config", "ConfigError", "Provider", "ModelRoute"),
    "schema": ("DEFAULT_INJECT_TEMPLATE",),
    "configfile": ("ConfigFile", "ConfigWatcher", "DEFAULT_CONFIG_TEMPLATE", "write_default_config"),
    "upstream": ("UpstreamError", "UpstreamResponse", "make_http_pool"),
    "text": ("Analyzer", "stem_english", "ENGLISH_STOPWORDS"),
    "bm25": ("BM25Index",),
    "documents": ("Chunk", "Document", "SkipFile", "extract", "count_tokens"),
    "chunking": ("chunk_document",),
    "dense": ("dense_top_k", "dense_top_k_compact", "dense_top_k_binary", "binary_pool"),
    "npy": ("StoreError",),
    "store": ("KBStore", "Generation", "GenerationWriter"),
    "embeddings": ("EmbeddingError", "EmbeddingRateLimited", "EmbeddingTransient", "EmbeddingFatal",
                   "RerankError", "BackoffGate", "EmbeddingCache", "EmbeddingClient", "RerankClient",
                   "parse_retry_after"),
    "inject": ("DEFAULT_CHUNK_TEMPLATE", "INJECT_MODES", "QUERY_SOURCES", "Conversation", "extract_query",
               "turn_key", "render_context", "estimate_tokens_text", "inject"),
    "docfolder": ("read_manifest",),
    "kb": ("KBSpec", "KnowledgeBase", "Hit", "IndexReport"),
    "knowledgebases": ("KnowledgeBases",),
    "api": ("Endpoint", "ENDPOINTS", "Request", "Response", "StreamResponse", "ClientError"),
    "retrieval": ("Retriever", "RetrievalFailed", "Retrieved", "split_model_kbs"),
    "mcp": ("McpServer",),
    "proxy": ("App", "Exchange"),
    "uploads": ("Uploads", "UploadError", "UploadLimits", "UploadedPart", "ALLOWED_UPLOAD_EXTS",
                "ARCHIVE_EXTS", "parse_multipart", "safe_relative_path", "expand_archive",
                "cleanup_staging"),
    "admintokens": ("issue_token", "verify_token"),
    "admin": ("Admin", "remove_deleted_kbs"),
    "server": ("make_server",),
    "cli": ("version_text", "main"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", *_MODULE_OF]


def __getattr__(name):
    """Load a public name from its module on first use (PEP 562); later reads are plain globals."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ragproxy' has no attribute {name!r}")
    value = getattr(__import__("_ragproxy." + module, fromlist=["_"]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


if __name__ == "__main__":
    from _ragproxy.cli import main
    sys.exit(main())
