"""Defaults that the config schema shares with the code that applies them.

Each value is written once, here: ``config``'s schema fills a missing key
with it, and the module that owns the behaviour uses it for callers that
pass no config (``KBSpec()``, ``chunk_document(doc)``, ``UploadLimits()``).
A default only one module needs stays in that module.

May import: nothing.
"""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100

# Chunk sizes are in estimated tokens (documents.count_tokens).  256 tokens
# (~190 English words, ~30 lines of code) with 32 tokens of overlap (12.5%):
# small enough that a 512-token embedding model never truncates a chunk even
# if the estimate is 50% low, and that five retrieved chunks fit in ~1.5k
# tokens of injected context; large enough that a chunk holds a full
# paragraph or function.
DEFAULT_CHUNK_SIZE = 256
DEFAULT_CHUNK_OVERLAP = 32
#: Files larger than this are skipped (knowledge_bases.NAME.max_file_bytes).
DEFAULT_MAX_BYTES = 10 * 1024 * 1024

#: BM25 parameters, chosen by measurement on SciFact train and CoSQA dev; the
#: optimum is flat around them (k1 1.0-1.5, b 0.75-0.9 are all within 0.005
#: nDCG@10).
BM25_K1 = 1.2
BM25_B = 0.75

#: Caps on one panel upload (the ``uploads`` config section).
UPLOAD_MAX_FILE_BYTES = 100 * 1024 * 1024
UPLOAD_MAX_FILES = 500
UPLOAD_MAX_TOTAL_BYTES = 2 * 1024 ** 3
UPLOAD_MAX_RATIO = 200.0   # unpacked / packed size: refuses zip bombs

#: Compression levers (the ``compression`` config section) and their session state.
#: A completion needs room in the window too: 1024 tokens covers a typical
#: coding answer; a request's own max_tokens may ask for more.
WINDOW_COMPLETION_RESERVE_TOKENS = 1024
#: summary_buffer: history under 1024 tokens is not worth a summarizer call;
#: the last 8 messages (about four exchanges) stay verbatim; a 512-token summary.
SUMMARY_MIN_TOKENS = 1024
SUMMARY_RETAIN_RECENT_MESSAGES = 8
SUMMARY_TARGET_TOKENS = 512
SUMMARIZER_TIMEOUT = 30.0
COMPRESSION_STATE_BACKENDS = ("sqlite", "redis")
#: Seconds a session's summary is kept unused: a week covers a paused work week.
COMPRESSION_STATE_TTL = 7 * 24 * 3600
