r"""Files become Documents: text extraction for every format ragproxy indexes.

extract() turns bytes into Documents (Markdown, reStructuredText, HTML, DOCX,
PDF through ``deps.pypdf``, notebooks, code, config files, BEIR JSONL); the
chunking module turns Documents into Chunks.  Pure functions over bytes and
strings: the caller does the directory walk, the manifest and the I/O.  Also
owns what ragproxy knows of the formats' structure that both need: the file
type tables and the Markdown/RST heading scanners.

Sizes are in *estimated tokens*: whitespace-separated words plus ASCII
punctuation characters plus CJK characters (count_tokens).  That tracks BPE
tokenizers within ~10-20% for English prose and for code alike, where a
plain word count undercounts code two- to threefold ("x = self.load(path)" is
3 words, 7 estimated tokens, ~8 BPE tokens).  It costs one str.split and one
bytes.translate per text: 0.4 s for the 31 MB of the stdlib's .py files,
within 2% of a regex tokenizer (\w+|[^\w\s]) that takes 3.6 s.

May import: defaults, deps.
"""
from __future__ import annotations

import dataclasses
import html.parser
import io
import json
import logging
import re
import zipfile

from . import deps
from .defaults import DEFAULT_MAX_BYTES

log = logging.getLogger("ragproxy")


# PDF and DOCX carry images and BEIR corpora are large by nature; their text is
# still bounded by what a page or a line can hold.
_MAX_BYTES_LARGE = 64 * 1024 * 1024
_MAX_ZIP_MEMBER = 64 * 1024 * 1024      # uncompressed word/document.xml (zip bombs)
WORD_RE = re.compile(r"\w+")


class SkipFile(Exception):
    """A file that is not indexed; ``str(exc)`` is the reason for the manifest."""

    @property
    def reason(self):
        return str(self)


@dataclasses.dataclass
class Document:
    """Text extracted from one file (or one record of a JSONL corpus).

    ``kind`` is one of markdown, rst, html, docx, pdf, code, config, text; it
    picks the "auto" chunking strategy.  HTML and DOCX text is Markdown-like
    (``#`` heading lines).  For PDF, ``page_starts[i]`` is the 1-based line of
    ``text`` where page i+1 begins.
    """
    text: str
    title: str
    kind: str
    source: str
    language: str = ""
    page_starts: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Chunk:
    """One retrievable passage.  ``id`` is stable across re-indexing: it is
    derived from the source path, ``hash`` (sha256 of index_text(), 20 hex
    digits) and the ordinal among identical chunks of the same document, so
    it does not move when lines are added above the chunk."""
    id: str
    text: str
    source: str
    title: str = ""
    headings: list = dataclasses.field(default_factory=list)
    symbol: str = ""
    line_start: int = 0
    line_end: int = 0
    hash: str = ""
    context: str = ""

    def index_text(self):
        """The text to embed and to index for BM25: context line, then text."""
        return self.context + "\n" + self.text if self.context else self.text

    def to_json(self):
        return {
            "id": self.id, "text": self.text, "source": self.source,
            "title": self.title, "headings": list(self.headings),
            "symbol": self.symbol, "line_start": self.line_start,
            "line_end": self.line_end, "hash": self.hash, "context": self.context,
        }

    @classmethod
    def from_json(cls, d):
        if not isinstance(d, dict):
            raise ValueError("chunk JSON must be an object, got %s" % type(d).__name__)
        missing = [k for k in ("id", "text", "source") if k not in d]
        if missing:
            raise ValueError("chunk JSON lacks %s" % ", ".join(missing))
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["headings"] = list(kwargs.get("headings") or [])
        return cls(**kwargs)


# --------------------------------------------------------------------------
# Token estimate

_ASCII_PUNCT = b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_ESTIMATE_CJK_RE = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def count_tokens(text):
    """Estimated LLM tokens in ``text`` (see the section comment)."""
    n = len(text.split())
    if text.isascii():
        b = text.encode("ascii")
    else:
        n += len(_ESTIMATE_CJK_RE.findall(text))
        b = text.encode("utf-8", "surrogatepass")
    return n + len(b) - len(b.translate(None, _ASCII_PUNCT))


# --------------------------------------------------------------------------
# File types

MARKDOWN_EXTS = {".md", ".markdown", ".mdx", ".mkd", ".mdown"}
RST_EXTS = {".rst", ".rest"}
HTML_EXTS = {".html", ".htm", ".xhtml"}
TEXT_EXTS = {".txt", ".text", ".log", ".csv", ".tsv", ".adoc", ".asciidoc", ".org", ".tex", ".me"}
CODE_EXTS = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".vue": "vue", ".svelte": "svelte",
    ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".kts": "kotlin",
    ".scala": "scala", ".sc": "scala", ".groovy": "groovy", ".gradle": "groovy",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp",
    ".hh": "cpp", ".hxx": "cpp", ".ino": "cpp", ".cs": "csharp", ".fs": "fsharp",
    ".swift": "swift", ".m": "objc", ".mm": "objc", ".dart": "dart", ".zig": "zig",
    ".rb": "ruby", ".rake": "ruby", ".gemspec": "ruby", ".php": "php",
    ".pl": "perl", ".pm": "perl", ".lua": "lua", ".r": "r", ".jl": "julia",
    ".ex": "elixir", ".exs": "elixir", ".erl": "erlang", ".hs": "haskell",
    ".ml": "ocaml", ".clj": "clojure", ".el": "lisp", ".lisp": "lisp", ".vim": "vim",
    ".nim": "nim", ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".fish": "shell",
    ".ps1": "powershell", ".bat": "batch", ".cmd": "batch",
    ".sql": "sql", ".proto": "proto", ".graphql": "graphql", ".gql": "graphql",
    ".tf": "hcl", ".hcl": "hcl", ".cmake": "cmake", ".mk": "make",
}
CONFIG_EXTS = {
    ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json",
    ".jsonc": "json", ".json5": "json", ".ini": "ini", ".cfg": "ini", ".conf": "ini",
    ".properties": "ini", ".env": "ini", ".xml": "xml", ".plist": "xml",
    ".css": "css", ".scss": "css", ".less": "css",
}
_CODE_NAMES = {
    "makefile": ("code", "make"), "gnumakefile": ("code", "make"),
    "dockerfile": ("code", "docker"), "containerfile": ("code", "docker"),
    "cmakelists.txt": ("code", "cmake"), "rakefile": ("code", "ruby"),
    "gemfile": ("code", "ruby"), "jenkinsfile": ("code", "groovy"),
    "vagrantfile": ("code", "ruby"), ".bashrc": ("code", "shell"),
    ".zshrc": ("code", "shell"), ".profile": ("code", "shell"),
    ".gitignore": ("config", "ini"), ".editorconfig": ("config", "ini"),
}
_BINARY_EXTS = {
    ".doc", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp", ".rtf", ".epub",
    ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".tar", ".7z", ".rar", ".jar", ".whl",
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".ico", ".webp", ".tif", ".tiff", ".psd",
    ".mp3", ".wav", ".flac", ".ogg", ".mp4", ".mkv", ".mov", ".avi", ".webm",
    ".exe", ".dll", ".so", ".dylib", ".o", ".a", ".lib", ".pyc", ".pyo", ".class",
    ".woff", ".woff2", ".ttf", ".otf", ".eot", ".sqlite", ".db", ".bin", ".dat",
    ".npy", ".npz", ".pkl", ".pickle", ".parquet", ".onnx", ".pt", ".safetensors",
}
_SHEBANG_LANGS = (
    ("python", "python"), ("node", "javascript"), ("deno", "typescript"),
    ("bash", "shell"), ("zsh", "shell"), ("sh", "shell"), ("ruby", "ruby"),
    ("perl", "perl"), ("php", "php"), ("lua", "lua"), ("Rscript", "r"),
)


def split_ext(path):
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    dot = name.rfind(".")
    ext = name[dot:].lower() if dot > 0 else ""
    return name, ext


def _stem(path):
    name, ext = split_ext(path)
    return name[: len(name) - len(ext)] if ext else name


def _classify(path, data):
    """(kind, language) from the file name, then from the content."""
    name, ext = split_ext(path)
    lower = name.lower()
    if lower in _CODE_NAMES:
        return _CODE_NAMES[lower]
    if ext in MARKDOWN_EXTS:
        return "markdown", ""
    if ext in RST_EXTS:
        return "rst", ""
    if ext in HTML_EXTS:
        return "html", ""
    if ext == ".pdf":
        return "pdf", ""
    if ext == ".docx":
        return "docx", ""
    if ext in (".jsonl", ".ndjson"):
        return "jsonl", ""
    if ext == ".ipynb":
        return "ipynb", ""
    if ext in TEXT_EXTS:
        return "text", ""
    if ext == ".m" and not re.search(rb"^\s*(#import|#include|@interface|@implementation)", data[:8192], re.M):
        return "code", "matlab"
    if ext in CODE_EXTS:
        return "code", CODE_EXTS[ext]
    if ext in CONFIG_EXTS:
        return "config", CONFIG_EXTS[ext]
    if ext in _BINARY_EXTS:
        return "unsupported", ext
    head = data[:1024]
    if head.startswith(b"%PDF-"):
        return "pdf", ""
    if head.startswith(b"PK\x03\x04"):
        return ("docx", "") if b"word/document.xml" in data else ("unsupported", ext or "zip")
    if head.startswith(b"#!"):
        first = head.split(b"\n", 1)[0].decode("latin-1")
        for word, lang in _SHEBANG_LANGS:
            if re.search(r"[/ ]%s[\d.]*\b" % word, first):
                return "code", lang
        return "code", "shell"
    probe = head.lstrip()[:200].lower()
    if probe.startswith((b"<!doctype html", b"<html")):
        return "html", ""
    return "text", ""


# --------------------------------------------------------------------------
# Decoding

_TEXT_BYTES = bytes(range(32, 127)) + b"\t\n\r\f\v\x1b" + bytes(range(128, 256))
_UTF8_SEQ_RE = re.compile(rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}")


def _decode(data, declared=""):
    """Bytes to str with ``\\n`` newlines; SkipFile for binary data."""
    if data.startswith(b"\xef\xbb\xbf"):
        text = data[3:].decode("utf-8", "replace")
    elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError:
            raise SkipFile("binary or corrupt UTF-16 data") from None
    else:
        if b"\0" in data:
            raise SkipFile("binary file (contains NUL bytes)")
        sample = data[:65536]
        controls = len(sample.translate(None, _TEXT_BYTES))
        if controls > max(2, len(sample) // 100):
            raise SkipFile("binary file (%d control bytes in the first %d)" % (controls, len(sample)))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = _decode_legacy(data, declared)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


def _decode_legacy(data, declared):
    sample = data[:65536]
    high = sum(1 for b in sample if b >= 0x80)
    utf8_bytes = sum(len(m) for m in _UTF8_SEQ_RE.findall(sample))
    if utf8_bytes * 2 > high:
        # Mostly UTF-8 with a few stray bytes: keep the UTF-8, mark the strays.
        return data.decode("utf-8", "replace")
    if declared:
        try:
            return data.decode(declared, "replace")
        except LookupError:
            pass
    if high * 10 > len(sample) * 3:
        # Cyrillic or Greek 8-bit code pages: decoding them as cp1252 gives mojibake.
        raise SkipFile("unknown 8-bit encoding (not UTF-8, %d%% non-ASCII bytes)"
                       % (100 * high // max(1, len(sample))))
    # cp1252 is what "latin-1" text from Windows usually is (smart quotes in
    # 0x80-0x9f); five bytes are undefined there, and latin-1 takes any byte.
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")


# --------------------------------------------------------------------------
# extract

def extract(path, data, max_bytes=None):
    """Documents in ``data``, the content of the file at ``path``.

    ``path`` is kept as given in Document.source (a relative path, usually).
    ``max_bytes`` None means 10 MiB, or 64 MiB for PDF, DOCX and JSONL.
    Raises SkipFile with a human-readable reason for files that are not indexed.
    """
    kind, language = _classify(path, data)
    if kind == "unsupported":
        raise SkipFile("unsupported format (%s)" % language)
    limit = max_bytes
    if limit is None:
        limit = _MAX_BYTES_LARGE if kind in ("pdf", "docx", "jsonl") else DEFAULT_MAX_BYTES
    if len(data) > limit:
        raise SkipFile("oversized: %d bytes, limit %d" % (len(data), limit))
    if kind == "pdf":
        return [_extract_pdf(path, data)]
    if kind == "docx":
        return [_extract_docx(path, data)]
    if kind == "html":
        return [_extract_html(path, data)]
    text = _decode(data)
    if kind == "jsonl":
        docs = _extract_beir(path, text)
        if docs is not None:
            return docs
        kind, language = "config", "json"
    if kind == "ipynb":
        return [_extract_notebook(path, text)]
    if kind in ("code", "config"):
        newlines = text.count("\n") + 1
        if len(text) > 20000 and len(text) // newlines > 500:
            raise SkipFile("minified or generated (average line %d chars)" % (len(text) // newlines))
        return [Document(text, split_ext(path)[0], kind, path, language)]
    if kind == "markdown":
        title = _markdown_title(text.split("\n"))
    elif kind == "rst":
        title = _rst_title(text.split("\n"))
    else:
        title = ""
    return [Document(text, title or _stem(path), kind, path)]


def _markdown_title(lines):
    front = _front_matter_end(lines)
    for line in lines[:front]:
        m = re.match(r"title\s*[:=]\s*(.+)$", line.strip())
        if m:
            return m.group(1).strip().strip("\"'")
    for _, level, title, _ in markdown_headings(lines):
        if level == 1 and title:
            return title
    return ""


def _rst_title(lines):
    heads = rst_headings(lines)
    return heads[0][2] if heads else ""


def _extract_beir(path, text):
    """One Document per ``{"_id", "title", "text"}`` line, or None if the file
    is not in BEIR corpus layout."""
    docs, bad = [], 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        is_doc = isinstance(obj, dict) and "_id" in obj and ("text" in obj or "title" in obj)
        if not is_doc:
            if not docs and not bad:
                return None
            bad += 1
            continue
        title = str(obj.get("title") or "")
        body = str(obj.get("text") or "") or title
        body = _clean_surrogates(body).replace("\r\n", "\n").replace("\r", "\n")
        docs.append(Document(body, _clean_surrogates(title), "text",
                             "%s#%s" % (path, obj["_id"])))
    if bad:
        log.warning("%s: skipped %d malformed JSONL line(s)", path, bad)
    return docs


def _clean_surrogates(s):
    # json.loads turns "\ud800" into a lone surrogate, which no encoder accepts.
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "replace").decode("utf-8")


def _extract_notebook(path, text):
    try:
        nb = json.loads(text)
        cells = nb.get("cells") or [c for ws in nb.get("worksheets", []) for c in ws.get("cells", [])]
        lang = ((nb.get("metadata") or {}).get("kernelspec") or {}).get("language") or "python"
    except (ValueError, AttributeError, TypeError) as e:
        raise SkipFile("unreadable notebook: %s" % e) from None
    parts = []
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if not src.strip():
            continue
        if cell.get("cell_type") == "markdown":
            parts.append(src.strip("\n"))
        elif cell.get("cell_type") == "code":
            parts.append("```%s\n%s\n```" % (lang, src.strip("\n")))
    md = "\n\n".join(parts).replace("\r\n", "\n")
    lines = md.split("\n")
    return Document(md, _markdown_title(lines) or _stem(path), "markdown", path)


# --------------------------------------------------------------------------
# PDF (pypdf: vendored, and probed by deps on the first PDF)

def _extract_pdf(path, data):
    pypdf = deps.pypdf
    if pypdf is None:
        raise SkipFile("pypdf not available")
    if b"%PDF-" not in data[:1024]:
        raise SkipFile("not a PDF (no %PDF- header)")
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except Exception:   # missing AES backend, bad key data: same outcome
                opened = 0
            if not opened:
                raise SkipFile("encrypted PDF")
        pages = []
        for number, page in enumerate(reader.pages, 1):
            try:
                pages.append(page.extract_text() or "")
            except Exception as e:   # one broken page must not lose the rest
                log.debug("%s: page %d: %s", path, number, e)
                pages.append("")
        meta = reader.metadata
        title = str(meta.title or "") if meta is not None else ""
    except SkipFile:
        raise
    except Exception as e:
        raise SkipFile("unreadable PDF: %s" % (str(e) or type(e).__name__)) from None
    lines, page_starts = [], []
    for text in pages:
        text = text.replace("\0", "").replace("\r\n", "\n").replace("\r", "\n")
        page_lines = [ln.rstrip() for ln in text.split("\n")]
        while page_lines and not page_lines[-1]:
            page_lines.pop()
        while page_lines and not page_lines[0]:
            page_lines.pop(0)
        if lines:
            lines.append("")
        page_starts.append(len(lines) + 1)
        lines.extend(page_lines)
    body = "\n".join(lines)
    if not body.strip():
        raise SkipFile("PDF has no extractable text (scanned images?)")
    title = re.sub(r"^Microsoft (Word|PowerPoint) - ", "", title).strip()
    return Document(body, title or _stem(path), "pdf", path, page_starts=page_starts)


# --------------------------------------------------------------------------
# DOCX (zipfile + ElementTree)

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _parse_xml(raw, what):
    import xml.etree.ElementTree as ET
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        # Office never writes a DTD; refusing them avoids entity expansion bombs.
        raise SkipFile("%s has a DTD, refused" % what)
    try:
        return ET.fromstring(raw)
    except ET.ParseError as e:
        raise SkipFile("corrupt %s: %s" % (what, e)) from None


def _extract_docx(path, data):
    if data.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        raise SkipFile("encrypted or legacy Word file (OLE container)")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise SkipFile("corrupt DOCX (not a zip archive)") from None
    with zf:
        names = set(zf.namelist())
        if "word/document.xml" not in names:
            raise SkipFile("not a DOCX (no word/document.xml)")

        def read(name):
            if name not in names:
                return None
            if zf.getinfo(name).file_size > _MAX_ZIP_MEMBER:
                raise SkipFile("oversized DOCX member %s" % name)
            try:
                return zf.read(name)
            except Exception as e:   # bad CRC, unsupported compression, ...
                raise SkipFile("corrupt DOCX member %s: %s" % (name, e)) from None

        body = _parse_xml(read("word/document.xml"), "word/document.xml")
        styles_raw = read("word/styles.xml")
        core_raw = read("docProps/core.xml")
    styles = {}
    if styles_raw:
        for st in _parse_xml(styles_raw, "word/styles.xml").iter(_W + "style"):
            name = st.find(_W + "name")
            if name is not None:
                styles[st.get(_W + "styleId", "")] = name.get(_W + "val", "").lower()
    title = ""
    if core_raw:
        node = _parse_xml(core_raw, "docProps/core.xml").find("{http://purl.org/dc/elements/1.1/}title")
        title = (node.text or "").strip() if node is not None else ""
    out, state = [], {"title": title, "first_heading": ""}
    root = body.find(_W + "body")
    _docx_blocks(root if root is not None else body, styles, out, state)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")
    title = state["title"] or state["first_heading"] or _stem(path)
    return Document(text, title, "docx", path)


def _docx_blocks(elem, styles, out, state):
    for child in elem:
        tag = child.tag
        if tag == _W + "p":
            _docx_paragraph(child, styles, out, state)
        elif tag == _W + "tbl":
            if out and out[-1]:
                out.append("")
            for row in child.findall(_W + "tr"):
                cells = []
                for cell in row.findall(_W + "tc"):
                    texts = [_docx_text(p).replace("\n", " ").strip() for p in cell.iter(_W + "p")]
                    cells.append(" ".join(t for t in texts if t))
                if any(cells):
                    out.append(" | ".join(cells))
            out.append("")
        elif tag in (_W + "sdt", _W + "customXml", _W + "sdtContent"):
            content = child.find(_W + "sdtContent")
            _docx_blocks(content if content is not None else child, styles, out, state)


def _docx_text(p):
    parts = []
    for node in p.iter():
        tag = node.tag
        if tag == _W + "t":
            parts.append(node.text or "")
        elif tag == _W + "tab":
            parts.append("\t")
        elif tag in (_W + "br", _W + "cr"):
            parts.append("\n")
        elif tag == _W + "noBreakHyphen":
            parts.append("-")
    return "".join(parts)


def _docx_paragraph(p, styles, out, state):
    text = _docx_text(p).strip()
    ppr = p.find(_W + "pPr")
    level, style, listed = 0, "", False
    if ppr is not None:
        st = ppr.find(_W + "pStyle")
        style_id = st.get(_W + "val", "") if st is not None else ""
        style = styles.get(style_id, style_id.lower())
        outline = ppr.find(_W + "outlineLvl")
        m = re.match(r"heading\s*(\d)$", style) or re.match(r"heading\s*(\d)$", style_id.lower())
        if m:
            level = int(m.group(1))
        elif outline is not None and outline.get(_W + "val", "").isdigit():
            level = int(outline.get(_W + "val")) + 1
        listed = ppr.find(_W + "numPr") is not None or style.startswith("list")
    if not text:
        if out and out[-1]:
            out.append("")
        return
    if style == "title":
        state["title"] = state["title"] or text
    if 1 <= level <= 9:
        heading = " ".join(text.split())
        state["first_heading"] = state["first_heading"] or heading
        if out and out[-1]:
            out.append("")
        out.extend(["#" * min(level, 6) + " " + heading, ""])
        return
    if text.startswith("#"):
        text = "\\" + text
    if listed:
        out.append("- " + text)
    else:
        if out and out[-1].startswith("- "):
            out.append("")
        out.extend([text, ""])


# --------------------------------------------------------------------------
# HTML (html.parser) to Markdown-like text

_HTML_DROP_TAGS = {
    "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object",
    "embed", "nav", "footer", "aside", "form", "button", "select", "textarea", "dialog",
}
# Matched against the words of class and id values split at "-" and "_", so
# "menu-bar" and "article_footer" count; never applied to the page's own
# html/body/main/article elements.
_HTML_DROP_CLASSES = {
    "sidebar", "sphinxsidebar", "sphinxsidebarwrapper", "related", "navbar", "nav",
    "navigation", "menu", "breadcrumb", "breadcrumbs", "headerlink", "toc", "footer",
    "cookie", "cookies", "skip", "sr", "hidden", "popup", "pagination", "prevnext",
    "banner", "advert", "ads", "share", "social",
}
_HTML_NEVER_DROP = {"html", "body", "main", "article"}
_HTML_DROP_ROLES = {"navigation", "contentinfo", "search", "complementary", "banner"}
_HTML_VOID = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
    "param", "source", "track", "wbr",
}
_HTML_BLOCK = {
    "p", "div", "section", "article", "main", "header", "ul", "ol", "dl", "dt", "dd",
    "table", "thead", "tbody", "tfoot", "tr", "blockquote", "figure", "figcaption",
    "details", "summary", "address", "body", "caption", "center", "hgroup",
}
_HTML_PARAGRAPH = {"p", "ul", "ol", "dl", "table", "blockquote", "figure", "section", "article"}


class _HTMLToText(html.parser.HTMLParser):
    """Readable Markdown-like text: ``#`` headings, ``-`` list items,
    ``|``-separated table cells, fenced <pre> blocks; navigation, scripts,
    styles and other page chrome dropped."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []           # finished lines
        self.cur = []           # fragments of the line being built
        self.stack = []         # open elements: (tag, dropped)
        self.dropping = 0       # open dropped elements
        self.pre = 0
        self.lists = []         # per open list: next number, or 0 for bullets
        self.heading = 0
        self.title_parts = None
        self.title = ""
        self.first_h1 = ""

    # -- line building
    def _flush(self):
        if self.pre:
            return      # <pre> text is taken whole at </pre>
        text = "".join(self.cur).strip()
        self.cur = []
        if not text or text == "-" or (text[-1] == "." and text[:-1].isdigit()):
            return      # empty, or a list item whose content was dropped
        if self.heading:
            text = "#" * self.heading + " " + text
        elif text.startswith("#"):
            text = "\\" + text
        self.out.append(text)

    def _blank(self):
        self._flush()
        if self.out and self.out[-1]:
            self.out.append("")

    # -- parser callbacks
    def handle_starttag(self, tag, attrs):
        if tag in _HTML_VOID:
            if not self.dropping:
                if tag == "br":
                    if self.pre:
                        self.cur.append("\n")
                    else:
                        self._flush()
                elif tag == "hr":
                    self._blank()
            return
        dropped = self.dropping > 0 or self._is_noise(tag, attrs)
        self.stack.append((tag, dropped))
        if dropped:
            self.dropping += 1
            return
        if tag == "title":
            self.title_parts = []
        elif len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            self._blank()
            self.heading = int(tag[1])
        elif tag == "pre":
            self._blank()
            self.out.append("```")
            self.pre += 1
        elif tag == "code" and not self.pre:
            self.cur.append("`")
        elif tag in ("ul", "ol"):
            if self.lists:
                self._flush()
            else:
                self._blank()
            self.lists.append(1 if tag == "ol" else 0)
        elif tag == "li":
            self._flush()
            indent = "  " * max(0, len(self.lists) - 1)
            if self.lists and self.lists[-1]:
                self.cur.append("%s%d. " % (indent, self.lists[-1]))
                self.lists[-1] += 1
            else:
                self.cur.append(indent + "- ")
        elif tag in ("td", "th"):
            if "".join(self.cur).strip():
                self.cur.append(" | ")
        elif tag in _HTML_PARAGRAPH:
            self._blank()
        elif tag in _HTML_BLOCK:
            self._flush()

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                break
        else:
            return      # stray end tag
        while len(self.stack) > i:
            open_tag, dropped = self.stack.pop()
            self._close(open_tag, dropped)

    def _close(self, tag, dropped):
        if dropped:
            self.dropping -= 1
            return
        if tag == "title" and self.title_parts is not None:
            self.title = " ".join("".join(self.title_parts).split())
            self.title_parts = None
        elif len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            if tag == "h1" and not self.first_h1:
                self.first_h1 = " ".join("".join(self.cur).split())
            self._flush()
            self.heading = 0
            self.out.append("")
        elif tag == "pre":
            raw = "".join(self.cur).strip("\n")
            self.cur = []
            self.pre -= 1
            self.out.extend(raw.split("\n") if raw else [])
            self.out.extend(["```", ""])
        elif tag == "code" and not self.pre:
            self.cur.append("`")
        elif tag in ("ul", "ol"):
            if self.lists:
                self.lists.pop()
            if self.lists:
                self._flush()
            else:
                self._blank()
        elif tag in _HTML_PARAGRAPH:
            self._blank()
        elif tag in _HTML_BLOCK or tag == "li":
            self._flush()

    def handle_data(self, data):
        if self.dropping:
            return
        if self.title_parts is not None:
            self.title_parts.append(data)
        elif self.pre:
            self.cur.append(data)
        else:
            text = re.sub(r"\s+", " ", data)
            if not self.cur or self.cur[-1].endswith((" ", "- ", ". ")):
                text = text.lstrip()
            if text:
                self.cur.append(text)

    def _is_noise(self, tag, attrs):
        if tag in _HTML_DROP_TAGS:
            return True
        for name, value in attrs:
            if name == "hidden" or (name == "aria-hidden" and value == "true"):
                return True
            if name == "role" and value in _HTML_DROP_ROLES:
                return True
            if name in ("class", "id") and value and tag not in _HTML_NEVER_DROP:
                if not _HTML_DROP_CLASSES.isdisjoint(re.split(r"[\s_-]+", value.lower())):
                    return True
        return False

    def result(self):
        self.close()
        while self.stack:
            self._close(*self.stack.pop())
        self._flush()
        return re.sub(r"\n{3,}", "\n\n", "\n".join(self.out)).strip("\n")


def _extract_html(path, data):
    declared = ""
    m = re.search(rb"<meta[^>]+charset=[\"']?([\w-]+)", data[:4096], re.I)
    if m:
        declared = m.group(1).decode("ascii")
    text = _decode(data, declared)
    parser = _HTMLToText()
    try:
        parser.feed(text)
        body = parser.result()
    except Exception as e:  # html.parser is lenient; this is a last resort
        raise SkipFile("unparsable HTML: %s" % e) from None
    return Document(body, parser.first_h1 or parser.title or _stem(path), "html", path)



# --------------------------------------------------------------------------
# Headings (Markdown and reStructuredText)

_ATX_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SETEXT_RE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")


def _front_matter_end(lines):
    """Index of the first line after a ``---``/``+++`` front matter block, or 0."""
    if lines and lines[0].strip() in ("---", "+++"):
        fence = lines[0].strip()
        for i in range(1, min(len(lines), 200)):
            if lines[i].strip() in (fence, "..."):
                return i + 1
    return 0


def markdown_headings(lines):
    """[(line index, level, title, heading lines)] of ATX and setext headings
    outside code fences."""
    heads = []
    fence = None
    i = _front_matter_end(lines)
    n = len(lines)
    while i < n:
        line = lines[i]
        m = _FENCE_RE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = None
        elif m and not (m.group(1)[0] == "`" and "`" in line.strip()[len(m.group(1)):]):
            fence = m.group(1)
        elif line.startswith("#") or line.startswith(" ") and line.lstrip().startswith("#"):
            h = _ATX_RE.match(line)
            if h:
                heads.append((i, len(h.group(1)), (h.group(2) or "").strip(), 1))
        elif (i + 1 < n and line.strip() and not line.startswith("    ")
              and (i == 0 or not lines[i - 1].strip())
              and _SETEXT_RE.match(lines[i + 1]) and not _SETEXT_RE.match(line)
              and not re.match(r"^\s*([-*+]|\d+[.)]|>|\|)\s", line)):
            level = 1 if lines[i + 1].strip()[0] == "=" else 2
            heads.append((i, level, line.strip(), 2))
            i += 2
            continue
        i += 1
    return heads


_RST_ADORN_RE = re.compile(r"^([!-/:-@\[-`{-~])\1+\s*$")


def rst_headings(lines):
    """[(line index of the section start, level, title, heading lines)]; levels follow the
    order in which adornment styles first appear, as docutils does."""
    heads, styles = [], {}
    n = len(lines)
    i = 0
    while i < n - 1:
        line = lines[i]
        over = _RST_ADORN_RE.match(line)
        if over and i + 2 < n:
            title = lines[i + 1].strip()
            under = _RST_ADORN_RE.match(lines[i + 2])
            if title and under and under.group(1) == over.group(1) and not _RST_ADORN_RE.match(lines[i + 1]):
                style = (over.group(1), True)
                level = styles.setdefault(style, len(styles) + 1)
                heads.append((i, level, title, 3))
                i += 3
                continue
        text = line.rstrip()
        under = _RST_ADORN_RE.match(lines[i + 1])
        if (under and text and not text[0].isspace() and not over
                and (i == 0 or not lines[i - 1].strip())
                and (len(lines[i + 1].strip()) >= len(text) or len(lines[i + 1].strip()) >= 4)):
            style = (under.group(1), False)
            level = styles.setdefault(style, len(styles) + 1)
            heads.append((i, level, text.strip(), 2))
            i += 2
            continue
        i += 1
    return heads
