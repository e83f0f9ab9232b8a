"""A documents folder's upload manifest (_ragproxy.docfolder): write_manifest and read_manifest, in-process.

On real folders under tmp_path: what is written reads back, and a missing,
unreadable or malformed manifest reads as no uploads (logged when it is
there but broken) rather than stopping the indexer.  How uploads fill it is
test_uploads's; how the indexer cites the names is test_kb's.
"""
import json
import logging

from _ragproxy import docfolder

FILES = {"0123456789abcdef0123456789abcdef.md": {"name": "guides/caf\u00e9.md", "size": 12, "sha256": "ab",
                                                 "uploaded_at": 1700000000}}


def test_the_manifest_round_trips(tmp_path):
    docfolder.write_manifest(str(tmp_path), FILES)
    assert docfolder.read_manifest(str(tmp_path)) == FILES
    assert json.loads((tmp_path / docfolder.UPLOAD_MANIFEST).read_text(encoding="utf-8")) == {"files": FILES}
    docfolder.write_manifest(str(tmp_path), {})
    assert docfolder.read_manifest(str(tmp_path)) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == [docfolder.UPLOAD_MANIFEST]   # no temp file left


def test_no_manifest_is_no_uploads(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        assert docfolder.read_manifest(str(tmp_path)) == {}
    assert caplog.records == []


def test_a_broken_manifest_reads_as_no_uploads_and_is_logged(tmp_path, caplog):
    path = tmp_path / docfolder.UPLOAD_MANIFEST
    for text in ("{not json", "[1, 2]", "\xff\xfe"):
        path.write_bytes(text.encode("latin-1"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ragproxy"):
            assert docfolder.read_manifest(str(tmp_path)) == {}, text
        assert "ignoring unreadable upload manifest" in caplog.text, text
    path.write_text('{"files": ["not", "a", "dict"]}', encoding="utf-8")
    assert docfolder.read_manifest(str(tmp_path)) == {}


def test_a_writer_reads_a_broken_manifest_strictly(tmp_path):
    path = tmp_path / docfolder.UPLOAD_MANIFEST
    assert docfolder.read_manifest(str(tmp_path), strict=True) == {}   # none yet: no uploads, no error
    for text in ("{not json", "[1, 2]", '{"files": ["not", "a", "dict"]}'):
        path.write_text(text, encoding="utf-8")
        try:
            docfolder.read_manifest(str(tmp_path), strict=True)
        except docfolder.ManifestError as e:
            assert str(path) in str(e) and "cannot be read" in str(e), text
        else:
            raise AssertionError(f"{text!r} read as a manifest")
    docfolder.write_manifest(str(tmp_path), FILES)
    assert docfolder.read_manifest(str(tmp_path), strict=True) == FILES
