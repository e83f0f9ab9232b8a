"""Documents: extract() per format (text, HTML, BEIR JSONL, notebooks, DOCX, PDF), SkipFile, count_tokens, in-process.

Inputs are the files in data/docs or built here (make_docx, make_pdf); a
test chunks a document only to see that the structure extraction found
(headings, pages) reaches the chunks.  chunk_document() itself is
test_chunking's.
"""
import io
import json
import os
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "data", "docs")

from _ragproxy import deps  # noqa: E402
from ragproxy import Chunk, SkipFile, chunk_document, count_tokens, extract  # noqa: E402

pypdf = deps.pypdf   # the vendored copy, as ragproxy finds it
needs_pypdf = pytest.mark.skipif(pypdf is None, reason="pypdf not importable")


def read(name):
    with open(os.path.join(DOCS, name), "rb") as f:
        return f.read()


def chunks_of(name, **kw):
    (doc,) = extract(name, read(name))
    return chunk_document(doc, **kw)


# ---------------------------------------------------------------- token counts and Chunk

def test_count_tokens_estimate():
    assert count_tokens("Hello, world.") == 4
    assert count_tokens("x = self.load(path)") == 7       # 3 words, 4 punctuation marks
    assert count_tokens("\u6f22\u5b57\u304b\u306a") == 5
    assert count_tokens("") == 0


def test_chunk_json_round_trip():
    chunk = chunks_of("sample.py", pack_symbols=False)[4]
    data = chunk.to_json()
    back = Chunk.from_json(json.loads(json.dumps(data)))
    assert back == chunk
    assert Chunk.from_json(dict(data, extra="ignored")) == chunk
    with pytest.raises(ValueError, match="id"):
        Chunk.from_json({"text": "x", "source": "y"})


# ---------------------------------------------------------------- HTML

def test_html_keeps_structure_and_drops_noise():
    (doc,) = extract("page.html", read("page.html"))
    assert doc.kind == "html" and doc.title == "Widgets"
    for noise in ("SECRET_TRACKER", "NAVLINK", "SIDEBAR", "FOOTER", "more noise", "color: red", "\u00b6"):
        assert noise not in doc.text
    lines = doc.text.split("\n")
    assert "# Widgets" in lines and "## Usage" in lines and "## Sizes" in lines
    assert "A widget is a small reusable component." in lines
    assert "- Create it with `Widget(name)`." in lines
    assert "```\nw = Widget(\"clock\")\nw.draw(panel)\n```" in doc.text
    assert "Name | Width" in lines and "small | 10" in lines
    assert "\\#1 tip: keep widgets small." in lines     # not mistaken for a heading
    chunks = chunk_document(doc, chunk_size=32, chunk_overlap=0)
    assert ["Widgets", "Usage"] in [c.headings for c in chunks]
    assert ["Widgets", "Sizes"] in [c.headings for c in chunks]


def test_html_sniffed_without_extension_and_legacy_charset():
    data = '<html><head><meta charset="windows-1252"></head><body><h1>Caf\xe9</h1><p>na\xefve</p></body></html>'
    (doc,) = extract("README", data.encode("cp1252"))
    assert doc.kind == "html" and doc.title == "Caf\u00e9" and "na\u00efve" in doc.text


# ---------------------------------------------------------------- BEIR JSONL

def test_beir_jsonl_documents():
    docs = extract("corpus.jsonl", read("corpus.jsonl"))
    assert [(d.source, d.title, d.text) for d in docs] == [
        ("corpus.jsonl#doc1", "Photosynthesis", "Plants convert light into chemical energy."),
        ("corpus.jsonl#doc2", "", "Mitochondria are the powerhouse of the cell."),
        ("corpus.jsonl#doc3", "Empty body", "Empty body"),
    ]
    chunks = chunk_document(docs[0])
    assert chunks[0].source == "corpus.jsonl#doc1"
    assert chunks[0].index_text() == "Photosynthesis\nPlants convert light into chemical energy."


def test_jsonl_that_is_not_beir_is_config_text():
    (doc,) = extract("events.jsonl", b'{"event": "start"}\n{"event": "stop"}\n')
    assert doc.kind == "config" and doc.source == "events.jsonl"


def test_beir_skips_malformed_lines():
    data = b'{"_id": "a", "text": "alpha"}\nnot json\n{"_id": "b", "text": "beta \\ud800"}\n'
    docs = extract("c.jsonl", data)
    assert [d.source for d in docs] == ["c.jsonl#a", "c.jsonl#b"]
    docs[1].text.encode("utf-8")     # lone surrogate replaced


# ---------------------------------------------------------------- skipping and decoding

def test_skip_binary_unsupported_and_oversized():
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    with pytest.raises(SkipFile, match="unsupported"):
        extract("logo.png", png)
    with pytest.raises(SkipFile, match="binary"):
        extract("data.txt", png)
    with pytest.raises(SkipFile, match="binary"):
        extract("noisy.txt", bytes(range(1, 32)) * 50)
    with pytest.raises(SkipFile, match="oversized") as info:
        extract("big.md", b"x" * 2000, max_bytes=1000)
    assert "2000" in info.value.reason
    with pytest.raises(SkipFile, match="minified"):
        extract("app.min.js", b"var a=1;" * 5000)


def test_legacy_encodings_decode_when_clearly_text():
    (doc,) = extract("fr.txt", "caf\u00e9 cr\u00e8me \u201cquoted\u201d\n".encode("cp1252"))
    assert doc.text == "caf\u00e9 cr\u00e8me \u201cquoted\u201d\n"
    (doc,) = extract("u16.txt", b"\xff\xfe" + "wide text\r\n".encode("utf-16-le"))
    assert doc.text == "wide text\n"
    mostly_utf8 = "na\u00efve r\u00e9sum\u00e9 ".encode() * 20 + b"stray \xff byte"
    (doc,) = extract("m.txt", mostly_utf8)
    assert doc.text.startswith("na\u00efve r\u00e9sum\u00e9") and "\ufffd" in doc.text


def test_shebang_and_special_names():
    (doc,) = extract("bin/tool", b"#!/usr/bin/env python3\ndef main():\n    pass\n")
    assert (doc.kind, doc.language) == ("code", "python")
    assert [c.symbol for c in chunk_document(doc)] == ["main"]
    (doc,) = extract("Dockerfile", b"FROM python:3.11\nRUN pip install x\n")
    assert doc.kind == "code"


def test_notebook_cells_become_markdown():
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# Analysis\n", "Load the data."]},
        {"cell_type": "code", "source": "df = load()\n"},
    ], "metadata": {"kernelspec": {"language": "python"}}}
    (doc,) = extract("a.ipynb", json.dumps(nb).encode())
    assert doc.kind == "markdown" and doc.title == "Analysis"
    assert doc.text == "# Analysis\nLoad the data.\n\n```python\ndf = load()\n```"


# ---------------------------------------------------------------- DOCX

def make_docx(body_xml, styles_xml=None, title=None):
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types xmlns="http://schemas.'
                    'openxmlformats.org/package/2006/content-types"/>')
        zf.writestr("word/document.xml", '<?xml version="1.0"?><w:document %s><w:body>%s'
                    '</w:body></w:document>' % (w, body_xml))
        if styles_xml:
            zf.writestr("word/styles.xml", '<w:styles %s>%s</w:styles>' % (w, styles_xml))
        if title:
            zf.writestr("docProps/core.xml", '<cp:coreProperties xmlns:cp="http://schemas.'
                        'openxmlformats.org/package/2006/metadata/core-properties" '
                        'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>%s</dc:title>'
                        '</cp:coreProperties>' % title)
    return buf.getvalue()


def para(text, style=None, numbered=False):
    ppr = ""
    if style or numbered:
        ppr = "<w:pPr>%s%s</w:pPr>" % (
            '<w:pStyle w:val="%s"/>' % style if style else "",
            '<w:numPr><w:ilvl w:val="0"/><w:numId w:val="1"/></w:numPr>' if numbered else "")
    runs = "".join("<w:r><w:t xml:space=\"preserve\">%s</w:t></w:r>" % t for t in text.split("|"))
    return "<w:p>%s%s</w:p>" % (ppr, runs)


def test_docx_headings_lists_tables_and_title():
    body = "".join([
        para("Quarterly Report", "Title"),
        para("Summary", "berschrift1"),                  # localized style id, named "heading 1"
        para("Sales grew |in every region."),
        para("Details", "Heading2"),
        para("First point", numbered=True),
        para("Second point", numbered=True),
        "<w:tbl><w:tr><w:tc>%s</w:tc><w:tc>%s</w:tc></w:tr><w:tr><w:tc>%s</w:tc><w:tc>%s</w:tc></w:tr></w:tbl>"
        % (para("Region"), para("Sales"), para("North"), para("12")),
        para("#hashtag is text"),
    ])
    styles = '<w:style w:styleId="berschrift1"><w:name w:val="heading 1"/></w:style>'
    (doc,) = extract("report.docx", make_docx(body, styles))
    assert doc.kind == "docx" and doc.title == "Quarterly Report"
    lines = doc.text.split("\n")
    assert "# Summary" in lines and "## Details" in lines
    assert "Sales grew in every region." in lines
    assert "- First point" in lines and "- Second point" in lines
    assert "Region | Sales" in lines and "North | 12" in lines
    assert "\\#hashtag is text" in lines
    chunks = chunk_document(doc, chunk_size=16, chunk_overlap=0)
    paths = [c.headings for c in chunks]
    assert ["Summary"] in paths and ["Summary", "Details"] in paths
    details = chunks[paths.index(["Summary", "Details"])]
    assert details.context == "Quarterly Report > Summary > Details"


def test_docx_core_title_and_failures():
    (doc,) = extract("a.docx", make_docx(para("Body text."), title="Core Title"))
    assert doc.title == "Core Title" and doc.text == "Body text."
    with pytest.raises(SkipFile, match="corrupt DOCX"):
        extract("bad.docx", b"PK\x03\x04 not really a zip")
    with pytest.raises(SkipFile, match="encrypted or legacy"):
        extract("secret.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 100)
    bomb = make_docx('<!DOCTYPE x [<!ENTITY a "aaaa">]>' + para("x"))
    with pytest.raises(SkipFile, match="DTD"):
        extract("dtd.docx", bomb)


# ---------------------------------------------------------------- PDF

def make_pdf(pages, title="Handbook"):
    """A minimal PDF with one Helvetica text line per entry of each page."""
    objects = []
    n = len(pages)
    kids = " ".join("%d 0 R" % (4 + 2 * i) for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(("<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n)).encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        ops = "BT /F1 12 Tf 14 TL 72 720 Td " + " T* ".join("(%s) Tj" % ln for ln in lines) + " ET"
        objects.append(("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
                        "<< /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (5 + 2 * i)).encode())
        objects.append(("<< /Length %d >>\nstream\n%s\nendstream" % (len(ops), ops)).encode())
    objects.append(("<< /Title (%s) >>" % title).encode())
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for k, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, len(objects), xref)
    return bytes(out)


@needs_pypdf
def test_pdf_pages_title_and_chunks():
    data = make_pdf([["Chapter one begins here with setup.", "It talks about setup in detail."],
                     ["Chapter two covers tuning the proxy."]])
    (doc,) = extract("manual.pdf", data)
    assert doc.kind == "pdf" and doc.title == "Handbook"
    assert doc.text.split("\n") == ["Chapter one begins here with setup.", "It talks about setup in detail.",
                                    "", "Chapter two covers tuning the proxy."]
    assert len(doc.page_starts) == 2 and doc.page_starts[0] == 1
    page2 = doc.text.split("\n")[doc.page_starts[1] - 1]
    assert page2.startswith("Chapter two")
    chunks = chunk_document(doc, chunk_size=16, chunk_overlap=0)
    labels = [c.headings for c in chunks]
    assert ["page 1"] in labels and ["page 2"] in labels
    assert chunks[0].context == "Handbook > page 1"
    whole = chunk_document(doc)
    assert whole[0].headings == ["pages 1-2"]


@needs_pypdf
def test_pdf_encrypted_and_corrupt():
    reader = pypdf.PdfReader(io.BytesIO(make_pdf([["Secret text."]])))
    writer = pypdf.PdfWriter()
    for page in reader.pages:
        writer.add_page(page)
    writer.encrypt("secret", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    with pytest.raises(SkipFile, match="encrypted PDF"):
        extract("locked.pdf", buf.getvalue())
    with pytest.raises(SkipFile, match="PDF"):
        extract("broken.pdf", b"%PDF-1.4\n garbage without objects")


def test_pdf_without_pypdf(monkeypatch):
    monkeypatch.setattr(deps, "pypdf", None)
    with pytest.raises(SkipFile, match="pypdf not available"):
        extract("manual.pdf", make_pdf([["text"]]))
