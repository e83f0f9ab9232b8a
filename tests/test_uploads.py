"""Tests for uploads: streaming multipart parsing, archive expansion, the documents folder."""
import hashlib
import http.client
import http.server
import io
import itertools
import json
import os
import random
import re
import struct
import tarfile
import threading
import zipfile

import pytest

import ragproxy as up
from _ragproxy.docfolder import write_manifest

BOUNDARY = "----WebKitFormBoundary7MA4YWxkTrZu0gW"
CT = "multipart/form-data; boundary=" + BOUNDARY


# --- helpers -----------------------------------------------------------------

def encode(parts, boundary=BOUNDARY):
    """A body as a browser sends it; parts are (field, filename or None, bytes)."""
    out = io.BytesIO()
    for field, filename, data in parts:
        out.write(b"--" + boundary.encode() + b"\r\n")
        disp = 'form-data; name="%s"' % field
        if filename is not None:
            escaped = filename.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
            disp += '; filename="%s"' % escaped
        out.write(b"Content-Disposition: " + disp.encode("utf-8") + b"\r\n")
        if filename is not None:
            out.write(b"Content-Type: application/octet-stream\r\n")
        out.write(b"\r\n" + data + b"\r\n")
    out.write(b"--" + boundary.encode() + b"--\r\n")
    return out.getvalue()


class Pieces:
    """A socket-like reader handing out at most the next size of ``sizes`` per read."""

    def __init__(self, data, sizes):
        self.data, self.pos, self.sizes = data, 0, iter(sizes)

    def read(self, n):
        k = min(n, next(self.sizes, n))
        piece = self.data[self.pos:self.pos + k]
        self.pos += len(piece)
        return piece


class Counting(io.BytesIO):
    def __init__(self, data):
        super().__init__(data)
        self.consumed = 0

    def read(self, n=-1):
        piece = super().read(n)
        self.consumed += len(piece)
        return piece


def snapshot(root):
    """Every file and folder under root, with sizes and hashes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, f), root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def ids():
    counter = itertools.count(1)
    return lambda: "%032x" % next(counter)


@pytest.fixture
def docs(tmp_path):
    """A documents folder that already holds one upload, under a root with another KB."""
    (tmp_path / "other-kb").mkdir()
    (tmp_path / "other-kb" / "keep.md").write_text("keep")
    d = str(tmp_path / "kb")
    ingest(d, [("files", "first.md", b"# first\n")], new_id=lambda: "f" * 32)
    return d


def ingest(docs, parts, limits=None, new_id=None, clock=lambda: 1700000000.0):
    body = encode(parts)
    return up.Uploads(limits, clock, new_id or ids()).ingest(io.BytesIO(body), CT, len(body), docs)


def rejected(docs, parts, status, match, limits=None, body=None, content_type=CT, length=None):
    """Assert the upload fails with ``status`` and leaves the whole root exactly as before."""
    root = os.path.dirname(docs)
    before = snapshot(root)
    body = encode(parts) if body is None else body
    with pytest.raises(up.UploadError) as info:
        up.Uploads(limits, new_id=ids()).ingest(io.BytesIO(body), content_type,
                                                len(body) if length is None else length, docs)
    assert info.value.status == status, info.value.message
    assert str(info.value) == info.value.message
    assert re.search(match, info.value.message), info.value.message
    assert snapshot(root) == before
    return info.value


def zip_bytes(entries, compression=zipfile.ZIP_DEFLATED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for entry, data in entries:
            zf.writestr(entry, data)
    return buf.getvalue()


def tar_bytes(members, gz=False):
    """members: (TarInfo, data or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def tinfo(name, kind=tarfile.REGTYPE, **kw):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def sha(data):
    return hashlib.sha256(data).hexdigest()


# --- multipart -----------------------------------------------------------------

def test_several_files_and_a_folder_are_stored_with_a_manifest(docs):
    files = {"a.md": b"# A\r\nline\r\n", "dir/sub/b.txt": b"bee", "c.py": b"print(1)\n"}
    result = ingest(docs, [("files", n, d) for n, d in files.items()] + [("note", None, b"hi")])
    assert result["skipped"] == []
    assert [s["name"] for s in result["stored"]] == list(files)
    assert [s["stored_as"] for s in result["stored"]] == ["%032x.md" % 1, "%032x.txt" % 2, "%032x.py" % 3]
    manifest = up.read_manifest(docs)
    for s in result["stored"]:
        data = files[s["name"]]
        with open(os.path.join(docs, s["stored_as"]), "rb") as f:
            assert f.read() == data
        assert s["size"] == len(data) and s["sha256"] == sha(data)
        assert manifest[s["stored_as"]] == {"name": s["name"], "size": len(data), "sha256": sha(data),
                                            "uploaded_at": 1700000000.0}
    assert manifest["f" * 32 + ".md"]["name"] == "first.md"   # the earlier upload is still there
    with open(os.path.join(docs, "manifest.json")) as f:
        assert set(json.load(f)["files"]) == set(manifest)
    assert sorted(os.listdir(os.path.dirname(docs))) == ["kb", "other-kb"]   # no staging left


def test_two_uploads_merge_the_manifest(docs):
    ingest(docs, [("f", "one.md", b"1")], new_id=lambda: "1" * 32)
    ingest(docs, [("f", "two.md", b"2")], new_id=lambda: "2" * 32)
    assert {v["name"] for v in up.read_manifest(docs).values()} == {"first.md", "one.md", "two.md"}
    assert sorted(os.listdir(docs)) == ["1" * 32 + ".md", "2" * 32 + ".md", "f" * 32 + ".md", "manifest.json"]


def test_concurrent_uploads_through_one_uploads_object_keep_every_entry(tmp_path):
    uploads = up.Uploads(clock=lambda: 0.0)
    docs = str(tmp_path / "kb")
    errors = []

    def one(i):
        body = encode([("f", "n%d.md" % i, b"x" * i)])
        try:
            uploads.ingest(io.BytesIO(body), CT, len(body), docs)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(v["name"] for v in up.read_manifest(docs).values()) == sorted("n%d.md" % i for i in range(16))


def test_an_upload_over_a_real_socket(tmp_path):
    uploads, docs = up.Uploads(), str(tmp_path / "kb")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            try:
                status, answer = 200, uploads.ingest(self.rfile, self.headers.get("Content-Type"),
                                                     self.headers.get("Content-Length"), docs)
            except up.UploadError as e:
                status, answer = e.status, {"error": e.message}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        files = [("files", "notes/a.md", random.Random(3).randbytes(300000)), ("files", "b.txt", b"b")]
        # Again with an .exe: nothing stored twice, the .exe skipped; the .exe alone is refused.
        answers = []
        for parts, status in ((files, 200), (files + [("files", "c.exe", b"MZ")], 200),
                              ([("files", "c.exe", b"MZ")], 400)):
            body = encode(parts)
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
            conn.putrequest("POST", "/upload")
            conn.putheader("Content-Type", CT)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            for i in range(0, len(body), 4999):   # odd-sized writes: pieces arrive split anywhere
                conn.send(body[i:i + 4999])
            response = conn.getresponse()
            answer = json.loads(response.read())
            conn.close()
            assert response.status == status, answer
            answers.append(answer)
        assert [len(answers[0]["stored"]), len(answers[1]["stored"]), len(answers[1]["unchanged"])] == [2, 0, 2]
        assert answers[1]["skipped"] == [{"name": "c.exe", "reason": "file type '.exe' is not accepted"}]
        assert "'.exe' is not accepted" in answers[2]["error"]
        assert len(up.read_manifest(docs)) == 2 and sorted(os.listdir(str(tmp_path))) == ["kb"]
    finally:
        server.shutdown()
        server.server_close()


def parse(body, tmp_path, reader=None, limits=None, content_type=CT):
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    parts = up.parse_multipart(reader or io.BytesIO(body), content_type, len(body), str(staging), limits)
    out = []
    for p in parts:
        if p.path is None:
            out.append((p.field, None, p.value))
        else:
            with open(p.path, "rb") as f:
                data = f.read()
            assert p.size == len(data) and p.sha256 == sha(data)
            os.unlink(p.path)
            out.append((p.field, p.filename, data))
    return out


TRICKY = [
    ("files", "a.md", b"--" + BOUNDARY.encode() + b" not at a line start\r\n\r\n"),
    ("files", "b.txt", b"\r\n--" + BOUNDARY.encode()[:-1] + b"\r\n-\r\r\n\r\n--"),
    ("kb", None, b"docs"),
    ("files", "c.txt", b"ends with CRLF\r\n"),
    ("files", "d.txt", b""),
    ("files", "e.txt", b"ends with CR\r"),
]


def expected(parts):
    return [(f, n, d.decode() if n is None else d) for f, n, d in parts]


def test_a_delimiter_split_at_every_offset_across_reads(tmp_path):
    body = encode(TRICKY)
    for k in range(1, len(body)):
        assert parse(body, tmp_path, Pieces(body, [k])) == expected(TRICKY), k


@pytest.mark.parametrize("size", range(1, 8))
def test_tiny_reads(tmp_path, size):
    body = encode(TRICKY)
    assert parse(body, tmp_path, Pieces(body, itertools.repeat(size))) == expected(TRICKY)
    rng = random.Random(size)
    assert parse(body, tmp_path, Pieces(body, iter(lambda: rng.randint(1, 7), None))) == expected(TRICKY)


def test_a_delimiter_across_the_64k_read_edge(tmp_path):
    head = len(encode([("files", "big.txt", b"")]).split(b"\r\n\r\n", 1)[0]) + 4
    noise = random.Random(0).randbytes(70000)
    for shift in range(-12, 12):
        data = noise[:65536 - head + shift]
        parts = [("files", "big.txt", data), ("files", "tail.md", b"t")]
        assert parse(encode(parts), tmp_path) == parts


def test_filename_star_and_escaped_quotes(tmp_path):
    body = (b"--B\r\nContent-Disposition: form-data; name=\"f\"; filename=\"EUR notes.md\"; "
            b"filename*=UTF-8''%E2%82%AC%20notes.md\r\n\r\neuro\r\n"
            b"--B\r\nContent-Disposition: form-data; name=\"f\"; filename=\"say %22hi%22.md\"\r\n\r\nq\r\n"
            b"--B\r\ncontent-disposition: form-data; name=f; filename=\"dir\\\\win.md\"\r\n\r\nw\r\n"
            b"--B\r\nContent-Disposition: form-data; name=\"f\"; filename=\"\"\r\n\r\n\r\n--B--")
    assert parse(body, tmp_path, content_type='multipart/form-data; boundary="B"') == [
        ("f", "\u20ac notes.md", b"euro"), ("f", 'say "hi".md', b"q"), ("f", "dir/win.md", b"w")]


def test_urllib3_bodies_are_accepted(tmp_path):
    urllib3 = pytest.importorskip("urllib3")
    body, content_type = urllib3.encode_multipart_formdata(
        [("files", ("dir/a.md", b"# a\r\n--x")), ("files", ("q\"uote.txt", b"")), ("kb", "docs")])
    assert parse(body, tmp_path, content_type=content_type) == [
        ("files", "dir/a.md", b"# a\r\n--x"), ("files", 'q"uote.txt', b""), ("kb", None, "docs")]


def test_a_large_form_field_is_refused(tmp_path):
    with pytest.raises(up.UploadError) as info:
        parse(encode([("kb", None, b"x" * (64 * 1024 + 1))]), tmp_path)
    assert info.value.status == 413


B = BOUNDARY.encode()
PART = b"--" + B + b'\r\nContent-Disposition: form-data; name="f"; filename="a.md"\r\n\r\nabc'


@pytest.mark.parametrize("body,content_type,length,status,match", [
    (PART + b"\r\n--" + B + b"--", CT, 999, 400, r"ended after \d+ of 999 bytes"),
    (PART + b"\r\n", CT, None, 400, "closing boundary"),
    (PART, CT, None, 400, "closing boundary"),
    (PART + b"\r\n--" + B + b"--", "multipart/form-data", None, 400, "boundary"),
    (PART + b"\r\n--" + B + b"--", "application/json", None, 400, "multipart/form-data"),
    (b"--" + B + b"\r\nContent-Type: text/plain\r\n\r\nabc\r\n--" + B + b"--", CT, None, 400,
     "no Content-Disposition"),
    (b"--" + B + b"\r\n\r\nabc\r\n--" + B + b"--", CT, None, 400, "no Content-Disposition"),
    (b"--" + B + b"\r\nContent-Disposition: form-data;\r\n name=f\r\n\r\nabc\r\n--" + B + b"--", CT, None, 400,
     "malformed multipart header line"),
    (b"--" + B + b"\r\nX-Pad: " + b"p" * 20000 + b"\r\n\r\n\r\n--" + B + b"--", CT, None, 400, "header block"),
    (b"--" + B + b"junk\r\n" + PART[len(B) + 4:] + b"\r\n--" + B + b"--", CT, None, 400, "after a boundary"),
    (PART + b"\r\n--" + B + b"--", CT, "ten", 400, "Content-Length"),
])
def test_malformed_bodies_are_refused(docs, body, content_type, length, status, match):
    rejected(docs, None, status, match, body=body, content_type=content_type, length=length)


def test_parse_multipart_removes_its_files_when_it_fails(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    body = encode([("f", "a.md", b"x" * 100), ("f", "b.md", b"x" * 2000)])
    with pytest.raises(up.UploadError):
        up.parse_multipart(io.BytesIO(body), CT, len(body), str(staging), up.UploadLimits(max_total_bytes=1500))
    assert os.listdir(str(staging)) == []


def test_no_content_length_is_411(docs):
    body = encode([("f", "a.md", b"x")])
    with pytest.raises(up.UploadError) as info:
        up.Uploads().ingest(io.BytesIO(body), CT, None, docs)
    assert info.value.status == 411


class StagingWatch(Counting):
    """A body reader that records the largest file in the staging folder after every read."""

    def __init__(self, data, root):
        super().__init__(data)
        self.root, self.largest = root, 0

    def read(self, n=-1):
        for staging in (e for e in os.scandir(self.root) if e.name.startswith(".staging-")):
            for f in os.scandir(staging.path):
                self.largest = max(self.largest, f.stat().st_size)
        return super().read(n)


def test_an_oversize_file_among_others_is_skipped_as_it_arrives_and_the_rest_stored(docs):
    limits = up.UploadLimits(max_file_bytes=1000)
    body = encode([("f", "ok.md", b"fine"), ("f", "big.txt", b"x" * 1000000), ("f", "after.md", b"later")])
    reader = StagingWatch(body, os.path.dirname(docs))
    result = up.Uploads(limits, new_id=ids()).ingest(reader, CT, len(body), docs)
    assert [s["name"] for s in result["stored"]] == ["ok.md", "after.md"]
    assert result["skipped"] == [{"name": "big.txt", "reason": "976.6 KiB, over the upload limit of 1000 B per "
                                                               "file (uploads.max_file_bytes)"}]
    assert reader.largest <= 1000 + 64 * 1024   # its bytes past the cap were never written
    assert "big.txt" not in {v["name"] for v in up.read_manifest(docs).values()}


def test_an_oversize_file_alone_is_refused_with_the_limit_and_its_key(docs):
    rejected(docs, [("f", "big.txt", b"x" * 1001)], 413,
             r"^'big.txt' is 1001 B, over the upload limit of 1000 B per file \(uploads.max_file_bytes\)$",
             limits=up.UploadLimits(max_file_bytes=1000))
    # The KB's own cap, when it is the smaller one, is the one named: the file would be skipped there.
    kb = up.UploadLimits(max_file_bytes=5000, kb_max_file_bytes=1000, kb_key="knowledge_bases.docs.max_file_bytes")
    rejected(docs, [("f", "big.txt", b"x" * 1001)], 413, r"over the knowledge base's limit of 1000 B per file "
             r"\(raise knowledge_bases.docs.max_file_bytes to index larger files\)", limits=kb)
    result = ingest(docs, [("f", "exact.md", b"x" * 1000), ("f", "big.md", b"x" * 1001),
                           ("f", "a.zip", zip_bytes([("in.md", b"y" * 1001), ("fits.md", b"z")]))], limits=kb)
    assert [s["name"] for s in result["stored"]] == ["exact.md", "a.zip/fits.md"]
    assert [(s["name"], "knowledge_bases.docs.max_file_bytes" in s["reason"]) for s in result["skipped"]] == [
        ("big.md", True), ("a.zip/in.md", True)]


@pytest.mark.parametrize("limits,match", [
    (up.UploadLimits(max_files=3), "more than 3 files"),
    (up.UploadLimits(max_total_bytes=300000), "uploads.max_total_bytes"),
])
def test_upload_caps_stop_the_reading(docs, limits, match):
    body = encode([("f", "%d.md" % i, b"x" * 100000) for i in range(10)])
    reader = Counting(body)
    with pytest.raises(up.UploadError) as info:
        up.Uploads(limits).ingest(reader, CT, len(body), docs)
    assert info.value.status == 413 and match in info.value.message
    assert reader.consumed < 5 * 100000


def test_upload_total_and_file_count_caps(docs):
    rejected(docs, [("f", "%d.md" % i, b"x") for i in range(4)], 413, "more than 3 files",
             limits=up.UploadLimits(max_files=3))
    rejected(docs, [("f", "%d.md" % i, b"x" * 600) for i in range(4)], 413, "uploads.max_total_bytes",
             limits=up.UploadLimits(max_total_bytes=2000))
    body = encode([("f", "a.md", b"x")])
    rejected(docs, None, 413, "uploads.max_total_bytes", body=body, length=10 ** 12)   # refused before reading


def test_a_new_documents_folder_is_not_left_behind(tmp_path):
    docs = str(tmp_path / "new" / "kb")
    with pytest.raises(up.UploadError):
        ingest(docs, [("f", "a.exe", b"MZ")])
    assert os.listdir(str(tmp_path)) == []
    with pytest.raises(RuntimeError):   # fails after creating the folder and moving a file in
        ingest(docs, [("f", "a.md", b"a"), ("f", "b.md", b"b")], new_id=lambda: "9" * 32)
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("name,match", [
    ("../x.md", "escapes"), ("a/../../x.md", "escapes"), ("/etc/x.md", "absolute"), ("C:\\x.md", "absolute"),
    ("\\\\server\\share\\x.md", "absolute"), ("a\0.md", "control"), ("a\n.md", "control"), ("./", "names no file"),
])
def test_unsafe_names_are_refused(name, match):
    with pytest.raises(up.UploadError) as info:
        up.safe_relative_path(name)
    assert info.value.status == 400 and match in info.value.message


def test_safe_names_are_normalized():
    assert up.safe_relative_path("./a//b\\c.md") == "a/b/c.md"
    assert up.safe_relative_path("..a/b..md") == "..a/b..md"


def test_a_traversing_multipart_filename_is_refused(docs):
    rejected(docs, [("f", "ok.md", b"x"), ("f", "../../evil.md", b"x")], 400, "escapes the upload folder")


def test_a_disallowed_file_type_alone_is_refused_by_name(docs):
    rejected(docs, [("f", "photo.png", b"\x89PNG")], 400, "'photo.png'.*'.png' is not accepted")
    rejected(docs, [("f", "README", b"x")], 400, "without an extension")
    rejected(docs, [("f", "docs/._guide.md", b"x")], 400, "macOS metadata, not a document")


def test_disallowed_files_among_others_are_skipped_and_the_rest_stored(docs):
    result = ingest(docs, [("f", "docs/guide.md", b"# guide"), ("f", "docs/img/logo.png", b"\x89PNG" * 1000),
                           ("f", "docs/README", b"x"), ("f", "docs/intro.txt", b"hello")])
    assert [s["name"] for s in result["stored"]] == ["docs/guide.md", "docs/intro.txt"]
    assert result["skipped"] == [{"name": "docs/img/logo.png", "reason": "file type '.png' is not accepted"},
                                 {"name": "docs/README", "reason": "no file extension"}]
    assert sorted(v["name"] for v in up.read_manifest(docs).values()) == ["docs/guide.md", "docs/intro.txt",
                                                                         "first.md"]
    assert not any(n.endswith(".png") for n in os.listdir(docs))
    # Nothing accepted at all: refused, every reason named.
    e = rejected(docs, [("f", "a.png", b"x"), ("f", "b.exe", b"MZ")], 400, "no accepted documents")
    assert "'a.png': file type '.png' is not accepted; 'b.exe': file type '.exe'" in e.message


def test_skipped_files_count_against_their_own_cap(docs):
    limits = up.UploadLimits(max_files=2)
    result = ingest(docs, [("f", "a.md", b"a")] + [("f", "%d.png" % i, b"x") for i in range(8)], limits=limits)
    assert len(result["stored"]) == 1 and len(result["skipped"]) == 8
    rejected(docs, [("f", "a.md", b"a")] + [("f", "%d.png" % i, b"x") for i in range(9)], 413,
             "more than 8 files of types that are not accepted", limits=limits)


def test_an_upload_without_files_is_refused(docs):
    rejected(docs, [("kb", None, b"docs")], 400, "no files")
    rejected(docs, [("f", "x.zip", zip_bytes([("a.png", b"x")]))], 400, "no accepted documents")


def test_a_failure_while_committing_removes_what_was_moved(docs):
    root = os.path.dirname(docs)
    before = snapshot(root)
    with pytest.raises(RuntimeError):
        ingest(docs, [("f", "a.md", b"a"), ("f", "b.md", b"b")], new_id=lambda: "9" * 32)
    assert snapshot(root) == before


# --- the same name again ---------------------------------------------------------

def test_the_same_file_uploaded_again_is_unchanged_not_stored_twice(docs):
    before = snapshot(docs)
    result = ingest(docs, [("f", "first.md", b"# first\n")], clock=lambda: 1800000000.0)
    assert result["stored"] == [] and result["skipped"] == []
    assert result["unchanged"] == [{"name": "first.md", "stored_as": "f" * 32 + ".md", "size": 8,
                                    "sha256": sha(b"# first\n")}]
    assert snapshot(docs) == before   # not even uploaded_at moves
    again = ingest(docs, [("f", "first.md", b"# first\n"), ("f", "x.zip", zip_bytes([("a.md", b"a")]))])
    assert len(again["unchanged"]) == 1 and [s["name"] for s in again["stored"]] == ["x.zip/a.md"]
    assert [s["name"] for s in ingest(docs, [("f", "x.zip", zip_bytes([("a.md", b"a")]))])["unchanged"]] == [
        "x.zip/a.md"]
    assert sorted(v["name"] for v in up.read_manifest(docs).values()) == ["first.md", "x.zip/a.md"]


def test_the_same_name_with_new_content_replaces_the_stored_file(docs):
    result = ingest(docs, [("f", "first.md", b"# first, edited\n")], clock=lambda: 1800000000.0)
    assert result["unchanged"] == []
    assert result["stored"] == [{"name": "first.md", "stored_as": "f" * 32 + ".md", "size": 16,
                                 "sha256": sha(b"# first, edited\n"), "replaced": True}]
    with open(os.path.join(docs, "f" * 32 + ".md"), "rb") as f:
        assert f.read() == b"# first, edited\n"
    assert up.read_manifest(docs) == {"f" * 32 + ".md": {"name": "first.md", "size": 16, "uploaded_at": 1800000000.0,
                                                         "sha256": sha(b"# first, edited\n")}}
    assert sorted(os.listdir(docs)) == ["f" * 32 + ".md", "manifest.json"]
    # A name is the whole relative path: the same file name in another folder is another file.
    other = ingest(docs, [("f", "sub/first.md", b"# first, edited\n")])
    assert other["stored"][0]["replaced"] is False and len(up.read_manifest(docs)) == 2


def test_one_name_twice_in_one_upload_keeps_the_first(docs):
    result = ingest(docs, [("f", "n.md", b"one"), ("f", "n.md", b"two")])
    assert [s["name"] for s in result["stored"]] == ["n.md"] and result["stored"][0]["sha256"] == sha(b"one")
    assert result["skipped"] == [{"name": "n.md", "reason": "the upload holds another file of this name; "
                                                            "the first one is kept"}]
    assert len(os.listdir(docs)) == 3   # first.md, n.md and the manifest: no staged copy left behind


def test_a_name_stored_twice_before_is_stored_once_after(docs):
    # Earlier versions stored every upload anew: two entries, one name.
    ingest(docs, [("f", "dup.md", b"old")], new_id=lambda: "1" * 32, clock=lambda: 1.0)
    manifest = up.read_manifest(docs)
    with open(os.path.join(docs, "2" * 32 + ".md"), "wb") as f:
        f.write(b"older")
    manifest["2" * 32 + ".md"] = {"name": "dup.md", "size": 5, "sha256": sha(b"older"), "uploaded_at": 0.5}
    write_manifest(docs, manifest)
    result = ingest(docs, [("f", "dup.md", b"new")])
    assert result["stored"][0]["stored_as"] == "1" * 32 + ".md" and result["stored"][0]["replaced"]
    assert sorted(os.listdir(docs)) == ["1" * 32 + ".md", "f" * 32 + ".md", "manifest.json"]
    assert sorted(v["name"] for v in up.read_manifest(docs).values()) == ["dup.md", "first.md"]


def test_unchanged_is_judged_by_the_stored_file_not_only_the_manifest(docs):
    # A crash after a new version was moved in but before the manifest was rewritten: the entry
    # still describes the old contents.  Uploading the old contents again must restore them.
    with open(os.path.join(docs, "f" * 32 + ".md"), "wb") as f:
        f.write(b"# first, edited\n")
    result = ingest(docs, [("f", "first.md", b"# first\n")])
    assert result["unchanged"] == [] and result["stored"][0]["replaced"]
    with open(os.path.join(docs, "f" * 32 + ".md"), "rb") as f:
        assert f.read() == b"# first\n"


def test_a_failure_after_replacing_a_file_puts_the_old_contents_back(docs):
    root = os.path.dirname(docs)
    before = snapshot(root)
    with pytest.raises(RuntimeError):   # the second new file's id is taken: fails after the replacement
        ingest(docs, [("f", "first.md", b"edited"), ("f", "a.md", b"a"), ("f", "b.md", b"b")],
               new_id=lambda: "9" * 32)
    assert snapshot(root) == before


def test_a_manifest_entry_with_a_hostile_stored_name_is_never_replaced(docs):
    manifest = up.read_manifest(docs)
    manifest["../../other-kb/keep.md"] = {"name": "keep.md", "size": 4, "sha256": sha(b"keep"), "uploaded_at": 9}
    write_manifest(docs, manifest)
    result = ingest(docs, [("f", "keep.md", b"evil")])
    assert result["stored"][0]["replaced"] is False and "/" not in result["stored"][0]["stored_as"]
    with open(os.path.join(os.path.dirname(docs), "other-kb", "keep.md")) as f:
        assert f.read() == "keep"


def test_seeded_sequences_of_uploads_keep_one_file_per_name_holding_the_latest_contents(tmp_path):
    rng = random.Random(15)
    names = ["a.md", "dir/a.md", "b.txt", "x.zip"]
    contents = [b"one", b"two", b"three"]
    uploads, docs = up.Uploads(new_id=ids()), str(tmp_path / "kb")
    latest = {}
    for _ in range(60):
        parts = []
        for name in rng.sample(names, rng.randint(1, 3)):
            data = rng.choice(contents)
            if name == "x.zip":
                parts.append(("f", name, zip_bytes([("m.md", data)])))
                name = "x.zip/m.md"
            else:
                parts.append(("f", name, data))
            expected = latest.get(name)
            latest[name] = data
            parts[-1] = parts[-1] + (name, expected)
        if rng.random() < 0.2:
            parts.append(("f", "junk.png", b"png", "junk.png", None))
        body = encode([p[:3] for p in parts])
        result = uploads.ingest(io.BytesIO(body), CT, len(body), docs)
        outcome = {s["name"]: "unchanged" for s in result["unchanged"]}
        outcome.update({s["name"]: "replaced" if s["replaced"] else "new" for s in result["stored"]})
        for _, _, data, name, before in (p for p in parts if p[3] != "junk.png"):
            want = "new" if before is None else "unchanged" if before == latest[name] else "replaced"
            assert outcome[name] == want, (name, before, latest[name])
        manifest = up.read_manifest(docs)
        assert sorted(v["name"] for v in manifest.values()) == sorted(latest)
        for stored_as, entry in manifest.items():
            with open(os.path.join(docs, stored_as), "rb") as f:
                assert f.read() == latest[entry["name"]] and entry["sha256"] == sha(latest[entry["name"]])
        assert sorted(os.listdir(docs)) == sorted(list(manifest) + ["manifest.json"])
    assert sorted(os.listdir(str(tmp_path))) == ["kb"]


def test_an_unreadable_manifest_is_not_overwritten_by_an_upload_or_a_removal(docs):
    # Overwriting it would forget every earlier upload's original name.
    with open(os.path.join(docs, "manifest.json"), "w") as f:
        f.write("{not json")
    rejected(docs, [("f", "new.md", b"x")], 409, r"manifest.json cannot be read: .*fix it or move it aside")
    with pytest.raises(up.UploadError) as info:
        up.Uploads().remove(docs, "f" * 32 + ".md")
    assert info.value.status == 409
    assert os.path.exists(os.path.join(docs, "f" * 32 + ".md"))


# --- archives -------------------------------------------------------------------

def test_zip_and_tar_members_are_stored_and_odd_ones_skipped(docs):
    z = zip_bytes([("guide/", b""), ("guide/intro.md", b"# intro"), ("guide/img.png", b"png"),
                   ("inner.zip", zip_bytes([("x.md", b"x")])), ("__MACOSX/guide/._intro.md", b"junk"),
                   ("./notes.txt", b"notes")])
    t = tar_bytes([(tinfo(".", tarfile.DIRTYPE), None), (tinfo("./src", tarfile.DIRTYPE), None),
                   (tinfo("./src/main.go", mode=0o644), b"package main"), (tinfo("./src/old.tgz"), b"\x1f\x8b")],
                  gz=True)
    result = ingest(docs, [("f", "bundle.zip", z), ("f", "code.tar.gz", t), ("f", "plain.md", b"p")])
    assert [(s["name"], s["size"]) for s in result["stored"]] == [
        ("bundle.zip/guide/intro.md", 7), ("bundle.zip/notes.txt", 5), ("code.tar.gz/src/main.go", 12),
        ("plain.md", 1)]
    assert result["skipped"] == [
        {"name": "bundle.zip/guide/img.png", "reason": "file type '.png' is not accepted"},
        {"name": "bundle.zip/inner.zip", "reason": "nested archive (not expanded)"},
        {"name": "bundle.zip/__MACOSX/guide/._intro.md", "reason": "macOS metadata"},
        {"name": "code.tar.gz/src/old.tgz", "reason": "nested archive (not expanded)"}]
    for s in result["stored"]:
        with open(os.path.join(docs, s["stored_as"]), "rb") as f:
            assert sha(f.read()) == s["sha256"] == up.read_manifest(docs)[s["stored_as"]]["sha256"]
    assert not any(n.endswith((".zip", ".tgz", ".gz")) for n in os.listdir(docs))


def test_a_plain_tar_is_expanded(docs):
    result = ingest(docs, [("f", "t.tar", tar_bytes([(tinfo("a/b.rst"), b"Title\n=====")]))])
    assert [s["name"] for s in result["stored"]] == ["t.tar/a/b.rst"]


@pytest.mark.parametrize("member,match", [
    ("../x.md", "archive member '../x.md' escapes the upload folder"),
    ("/abs/x.md", "archive member '/abs/x.md' is an absolute path"),
    ("C:/x.md", "absolute path"),
    ("../", "archive member '../' escapes"),
])
def test_zip_members_that_escape_are_refused(docs, member, match):
    rejected(docs, [("f", "a.zip", zip_bytes([("ok.md", b"ok"), (member, b"x")]))], 400, match)


def test_tar_members_that_escape_are_refused(docs):
    rejected(docs, [("f", "a.tgz", tar_bytes([(tinfo("ok.md"), b"ok"), (tinfo("../../x.md"), b"x")], gz=True))],
             400, "escapes the upload folder")


def test_a_zip_symlink_is_refused(docs):
    info = zipfile.ZipInfo("link.md")
    info.create_system = 3
    info.external_attr = 0o120777 << 16
    rejected(docs, [("f", "a.zip", zip_bytes([("ok.md", b"ok"), (info, b"/etc/passwd")]))], 400,
             "'link.md' is a symbolic link")


@pytest.mark.parametrize("ti,match", [
    (tinfo("l.md", tarfile.SYMTYPE, linkname="/etc/passwd"), "is a symbolic link"),
    (tinfo("h.md", tarfile.LNKTYPE, linkname="ok.md"), "is a hard link"),
    (tinfo("c.md", tarfile.CHRTYPE, devmajor=1, devminor=3), "is a character device"),
    (tinfo("b.md", tarfile.BLKTYPE, devmajor=8, devminor=0), "is a block device"),
    (tinfo("f.md", tarfile.FIFOTYPE), "is a fifo"),
])
def test_tar_links_and_special_files_are_refused(docs, ti, match):
    rejected(docs, [("f", "a.tar", tar_bytes([(tinfo("ok.md"), b"ok"), (ti, None)]))], 400, match)


def test_encrypted_zip_members_are_refused(docs):
    data = bytearray(zip_bytes([("secret.md", b"s" * 100)]))
    central = data.rfind(b"PK\x01\x02")
    data[central + 8] |= 1
    data[6] |= 1
    rejected(docs, [("f", "a.zip", bytes(data))], 400, "zip member 'secret.md' is encrypted")


def test_truncated_archives_are_refused(docs):
    rng = random.Random(1)
    text = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(200000)).encode()
    tgz = tar_bytes([(tinfo("a.md"), text), (tinfo("b.md"), text)], gz=True)
    rejected(docs, [("f", "a.tar.gz", tgz[:len(tgz) // 2])], 400, "truncated or corrupt")
    rejected(docs, [("f", "a.tar.gz", tgz[:-4])], 400, "truncated or corrupt")   # only the gzip trailer
    tar = tar_bytes([(tinfo("a.md"), text)])
    rejected(docs, [("f", "a.tar", tar[:len(tar) // 2])], 400, "truncated or corrupt")
    z = zip_bytes([("a.md", text), ("b.md", text)])
    rejected(docs, [("f", "a.zip", z[:len(z) // 2])], 400, "truncated or corrupt")
    rejected(docs, [("f", "a.zip", z[:-30])], 400, "truncated or corrupt")


def test_archives_that_are_not_what_their_name_says(docs):
    rejected(docs, [("f", "a.zip", b"just text")], 400, "'a.zip' is not a zip archive")
    rejected(docs, [("f", "a.tgz", zip_bytes([("a.md", b"x")]))], 400, "not a gzip-compressed tar")
    rejected(docs, [("f", "a.tar", b"x" * 2048)], 400, "not a tar archive")


def zip_of_zeros(megabytes, name="bomb.txt"):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open(name, "w") as f:
            for _ in range(megabytes):
                f.write(bytes(1024 * 1024))
    return buf.getvalue()


def test_a_zip_bomb_is_refused_before_anything_is_written(docs, tmp_path):
    bomb = zip_of_zeros(50)
    rejected(docs, [("f", "bomb.zip", bomb)], 400,
             r"zip member 'bomb.txt' expands \d+x \(limit 200x\): refusing a possible zip bomb")
    path, staging = tmp_path / "bomb.zip", tmp_path / "stage"
    path.write_bytes(bomb)
    staging.mkdir()
    with pytest.raises(up.UploadError):
        up.expand_archive(str(path), "bomb.zip", str(staging), up.UploadLimits())
    assert os.listdir(str(staging)) == []


def test_many_small_compressible_members_are_refused_as_a_whole(docs):
    # Each member is under the 1 MiB floor, the archive as a whole expands ~1000x.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(20):
            zf.writestr("m%d.txt" % i, bytes(1000 * 1000))
    rejected(docs, [("f", "many.zip", buf.getvalue())], 400, r"many.zip as a whole expands \d+x")


def test_a_gzip_bomb_in_a_tgz_is_refused(docs):
    rejected(docs, [("f", "b.tgz", tar_bytes([(tinfo("z.txt"), bytes(30 * 1024 * 1024))], gz=True))], 400,
             "b.tgz as a whole expands")


def test_a_zip_that_lies_about_a_member_size_is_caught_while_extracting(docs, tmp_path):
    data = bytearray(zip_of_zeros(5, "a.txt"))   # ~5 KiB packed: honest, it would be a bomb
    central = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, 5000)
    struct.pack_into("<I", data, 22, 5000)
    rejected(docs, [("f", "liar.zip", bytes(data))], 400, "truncated or corrupt")
    path, staging = tmp_path / "liar.zip", tmp_path / "stage"
    path.write_bytes(bytes(data))
    staging.mkdir()
    with pytest.raises(up.UploadError):
        up.expand_archive(str(path), "liar.zip", str(staging))
    assert sum(os.path.getsize(str(p)) for p in staging.iterdir()) <= 5000


def test_a_zip_claiming_too_many_entries_is_refused_before_its_directory_is_read(docs):
    data = bytearray(zip_bytes([("a.md", b"a")]))
    struct.pack_into("<HH", data, data.rfind(b"PK\x05\x06") + 8, 60000, 60000)
    assert len(zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()) == 1   # zipfile itself does not care
    rejected(docs, [("f", "a.zip", bytes(data))], 413, "a.zip has 60000 members")


def test_archive_member_caps(docs):
    limits = up.UploadLimits(max_file_bytes=1000, max_files=3)
    rejected(docs, [("f", "a.zip", zip_bytes([("big.md", os.urandom(1001))]))], 413,
             r"no accepted documents: 'a.zip/big.md': 1001 B, over the upload limit", limits=limits)
    rejected(docs, [("f", "a.tar", tar_bytes([(tinfo("big.md"), os.urandom(1001))]))], 413, "uploads.max_file_bytes",
             limits=limits)
    rejected(docs, [("f", "a.zip", zip_bytes([("%d.md" % i, b"x") for i in range(4)]))], 413, "more than 3 files",
             limits=limits)
    rejected(docs, [("f", "a.md", b"x"), ("f", "a.tgz", tar_bytes([(tinfo("%d.md" % i), b"x") for i in range(3)],
                                                                   gz=True))], 413, "more than 3 files", limits=limits)
    rejected(docs, [("f", "a.zip", zip_bytes([("%d.png" % i, b"x") for i in range(13)]))], 413, "13 members",
             limits=limits)
    rejected(docs, [("f", "a.zip", zip_bytes([("%d.md" % i, os.urandom(400)) for i in range(3)]))], 413,
             "uploads.max_total_bytes", limits=up.UploadLimits(max_total_bytes=1000))


# --- documents folder -----------------------------------------------------------

def test_remove_document(docs):
    result = ingest(docs, [("f", "a.md", b"a"), ("f", "b.md", b"b")])
    gone, kept = (s["stored_as"] for s in result["stored"])
    assert up.Uploads().remove(docs, gone)["name"] == "a.md"
    assert not os.path.exists(os.path.join(docs, gone))
    assert set(up.read_manifest(docs)) == {kept, "f" * 32 + ".md"}
    for bad in (gone, "../kb/" + kept, "manifest.json", "", ".."):
        with pytest.raises(up.UploadError) as info:
            up.Uploads().remove(docs, bad)
        assert info.value.status == 400
    assert os.path.exists(os.path.join(docs, kept))


def test_read_manifest_of_nothing_or_garbage(tmp_path):
    assert up.read_manifest(str(tmp_path / "missing")) == {}
    (tmp_path / "manifest.json").write_text("{not json")
    assert up.read_manifest(str(tmp_path)) == {}


def test_cleanup_staging_removes_only_old_staging_folders(tmp_path):
    for name in (".staging-old", ".staging-new", "kb"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "up-1").write_bytes(b"x")
    os.utime(str(tmp_path / ".staging-old" / "up-1"), (1000, 1000))
    os.utime(str(tmp_path / ".staging-old"), (1000, 1000))
    os.utime(str(tmp_path / "kb"), (1000, 1000))
    now = os.path.getmtime(str(tmp_path / ".staging-new"))
    assert up.cleanup_staging(str(tmp_path), 3600, clock=lambda: now + 60) == [".staging-old"]
    assert sorted(os.listdir(str(tmp_path))) == [".staging-new", "kb"]
    assert up.cleanup_staging(str(tmp_path / "absent")) == []
