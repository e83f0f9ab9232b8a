"""Panel uploads into a knowledge base's documents folder: multipart bodies and archives.

The admin panel uploads files, folders and archives.  Everything lands first
in a staging folder beside the documents folder (same filesystem, so the
final os.replace is a rename, and outside every KB folder, so the indexer
never sees half a file); only an upload that passed every check is moved in,
and a rejected one leaves nothing behind.  Its files land a moment before
the upload manifest (``docfolder``) names them; the indexer reads the names
on every pass, so that moment does not last.  Stored files get random names
(<uuid hex><ext>): original names are untrusted paths and may collide.

An upload is known by its original relative name: the same name with the
same contents again is reported unchanged and not stored twice, the same
name with new contents replaces the stored file under its stored name (so
an edited guide.md updates the one the KB has).  A file of a type not
accepted, or over the per-file cap (the smaller of uploads.max_file_bytes
and the KB's own max_file_bytes, so nothing is stored only for the indexer
to skip), is left out with its reason and the rest stored, as in archives;
an upload that is that one file is refused instead.

Nothing is held in memory whole: multipart bodies and archive members move
in 64 KiB pieces and every cap is enforced as bytes arrive.  Archive caps
are checked twice, on the sizes an archive declares (so a zip bomb is
refused before a byte is written) and on the bytes actually produced (so a
lying header cannot get past them).  Compression-ratio checks start once
1 MiB is unpacked: small repetitive files legitimately compress 500x.

May import: defaults, docfolder, documents, files.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import hashlib
import os
import re
import shutil
import struct
import tarfile
import tempfile
import threading
import time
import urllib.parse
import uuid
import zipfile
import zlib

from .defaults import UPLOAD_MAX_FILE_BYTES, UPLOAD_MAX_FILES, UPLOAD_MAX_RATIO, UPLOAD_MAX_TOTAL_BYTES
from .docfolder import UPLOAD_MANIFEST, ManifestError, read_manifest, write_manifest
from .documents import CODE_EXTS, CONFIG_EXTS, HTML_EXTS, MARKDOWN_EXTS, RST_EXTS, TEXT_EXTS, split_ext
from .files import human_size, remove_leftover_dirs

ALLOWED_UPLOAD_EXTS = frozenset(
    MARKDOWN_EXTS | RST_EXTS | HTML_EXTS | TEXT_EXTS | set(CODE_EXTS) | set(CONFIG_EXTS)
    | {".pdf", ".docx", ".jsonl", ".ndjson", ".ipynb"})
ARCHIVE_EXTS = (".tar.gz", ".tgz", ".tar", ".zip")
_PIECE = 64 * 1024
_RATIO_FLOOR = 1024 * 1024
_MAX_FIELD_BYTES = 64 * 1024
_MAX_FIELDS = 100
_MEMBERS_PER_FILE = 4       # archive entries allowed per stored file (folders, skipped files)
_STAGING_PREFIX = ".staging-"
_OVERSIZE = " per file ("   # in every reason a file is too large, and only there
_S_IFMT, _S_IFLNK, _S_IFREG, _S_IFDIR = 0o170000, 0o120000, 0o100000, 0o040000


class UploadError(Exception):
    """An upload refused as a whole; ``status`` is the HTTP status to answer."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass
class UploadLimits:
    max_file_bytes: int = UPLOAD_MAX_FILE_BYTES
    max_files: int = UPLOAD_MAX_FILES
    max_total_bytes: int = UPLOAD_MAX_TOTAL_BYTES
    max_ratio: float = UPLOAD_MAX_RATIO
    max_part_header_bytes: int = 16 * 1024
    # The receiving KB's own cap (knowledge_bases.<kb>.max_file_bytes) and that key: a file the
    # indexer would skip as too large is not stored only to be skipped there.
    kb_max_file_bytes: int = None
    kb_key: str = None

    def file_cap(self):
        """The largest file this upload stores: the smaller of the upload's and the KB's caps."""
        if self.kb_max_file_bytes is None:
            return self.max_file_bytes
        return min(self.max_file_bytes, self.kb_max_file_bytes)

    def oversize_reason(self, size):
        """Why a file of ``size`` bytes (over file_cap()) is not stored, naming the key to raise."""
        cap = self.file_cap()
        if self.kb_max_file_bytes is not None and self.kb_max_file_bytes <= self.max_file_bytes:
            key = self.kb_key or "knowledge_bases.<kb>.max_file_bytes"
            return (f"{human_size(size)}, over the knowledge base's limit of {human_size(cap)}{_OVERSIZE}"
                    f"raise {key} to index larger files)")
        return f"{human_size(size)}, over the upload limit of {human_size(cap)}{_OVERSIZE}uploads.max_file_bytes)"


@dataclasses.dataclass
class UploadedPart:
    """One multipart part: a staged file (``path``), a form field (``value``, no ``filename``)
    or a file not kept (``skip``: why, ``skip_status``: the status refusing it alone would take)."""

    field: str
    filename: str
    path: str
    size: int
    sha256: str
    value: str = None
    skip: str = None
    skip_status: int = None


def safe_relative_path(name):
    """``name`` as a normalized relative POSIX path; UploadError(400) if it could escape."""
    return _safe_rel(name, "file name")


def _safe_rel(name, what):
    if not isinstance(name, str) or not name.strip():
        raise UploadError(400, f"{what} is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise UploadError(400, f"{what} {name!r} contains control characters")
    path = name.replace("\\", "/")
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        raise UploadError(400, f"{what} {name!r} is an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UploadError(400, f"{what} {name!r} escapes the upload folder")
    if not parts:
        raise UploadError(400, f"{what} {name!r} names no file")
    return "/".join(parts)


def _member_path(display_name, name, is_dir):
    """A member's safe relative path; "" for a folder entry that names the archive root ("./")."""
    if is_dir and all(p in ("", ".") for p in name.replace("\\", "/").split("/")):
        return ""
    try:
        return _safe_rel(name, "archive member")
    except UploadError as e:
        raise UploadError(e.status, f"{display_name}: {e.message}") from None


def _archive_kind(name):
    lower = name.lower()
    for ext in ARCHIVE_EXTS:
        if lower.endswith(ext):
            return ext
    return None


def _too_big(message):
    return UploadError(413, message)


def _too_many_files(limits):
    return _too_big(f"the upload holds more than {limits.max_files} files (uploads.max_files)")


def _too_much(limits):
    return _too_big(f"the upload holds more than {human_size(limits.max_total_bytes)} (uploads.max_total_bytes)")


class _Budget:
    """Files and bytes that one upload will store, across all its parts and archives."""

    def __init__(self, limits):
        self.limits = limits
        self.files = 0
        self.bytes = 0

    def add(self, size):
        """Count one file to store; its own size was checked against file_cap() already."""
        lim = self.limits
        self.files += 1
        if self.files > lim.max_files:
            raise _too_many_files(lim)
        self.bytes += size
        if self.bytes > lim.max_total_bytes:
            raise _too_much(lim)


class _StagedFile:
    """A new randomly named file in the staging folder, hashed and size-capped as it is written."""

    def __init__(self, staging_dir, cap, cap_error):
        with self._staging_errors():
            fd, self.path = tempfile.mkstemp(prefix="up-", dir=staging_dir)
        self.file = os.fdopen(fd, "wb")
        self.cap, self.cap_error = cap, cap_error
        self.size = 0
        self.hash = hashlib.sha256()

    def write(self, data):
        self.size += len(data)
        if self.size > self.cap:
            raise self.cap_error()
        self.hash.update(data)
        with self._staging_errors():
            self.file.write(data)

    def close(self):
        # Flushed to disk before it is moved in: a rename over an earlier upload of the same
        # name must not leave, after a power cut, neither the old contents nor the new.
        with self._staging_errors():
            if not self.file.closed:
                self.file.flush()
                os.fsync(self.file.fileno())
        self.file.close()

    def discard(self):
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    @staticmethod
    @contextlib.contextmanager
    def _staging_errors():
        # The server's fault (507/500): left as OSError, an archive's error handler would call it corrupt (400).
        try:
            yield
        except OSError as e:
            full = e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
            raise UploadError(507 if full else 500, f"cannot stage the upload on the server: {e}") from e


# --- multipart/form-data ------------------------------------------------------
# RFC 7578 over RFC 2046: a delimiter is CRLF "--" boundary, so the CRLF
# before it belongs to the delimiter, not to the part's content.  Searching
# for CRLF--boundary across a buffer that keeps the last len(delimiter) - 1
# bytes finds delimiters split across reads; text that merely resembles one
# is content.  Browsers escape '"', CR and LF in filenames as %22, %0D, %0A.

_PARAM_RE = re.compile(r';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


def _header_params(value):
    """('form-data', {param: value}) from a Content-Disposition or Content-Type value."""
    head, _, rest = value.partition(";")
    params = {}
    for m in _PARAM_RE.finditer(";" + rest):
        v = m.group(2).strip()
        if v.startswith('"') and v.endswith('"') and len(v) >= 2:
            v = re.sub(r'\\(["\\])', r"\1", v[1:-1])
        params.setdefault(m.group(1).lower(), v)
    return head.strip().lower(), params


def _part_filename(params):
    if "filename*" in params:
        charset, _, rest = params["filename*"].partition("'")
        _lang, _, encoded = rest.partition("'")
        try:
            return urllib.parse.unquote(encoded, encoding=charset or "utf-8", errors="strict")
        except (LookupError, UnicodeDecodeError):
            raise UploadError(400, f"cannot decode filename* {params['filename*']!r}") from None
    name = params.get("filename")
    if name is None:
        return None
    return re.sub(r"%(22|0D|0A)", lambda m: chr(int(m.group(1), 16)), name, flags=re.I)


class _Multipart:
    def __init__(self, stream, length, boundary, staging_dir, limits):
        self.stream, self.left = stream, length
        self.length = length
        self.delim = b"\r\n--" + boundary
        self.buf = bytearray(b"\r\n")   # lets a delimiter on the very first line match like any other
        self.staging_dir, self.limits = staging_dir, limits
        self.total = 0
        self.staged = []
        self.kept = 0      # file parts of a type that is stored (archives included)
        self.passed = 0    # file parts left out for their type

    def _more(self):
        if self.left <= 0:
            raise UploadError(400, "multipart body ends before its closing boundary (truncated upload?)")
        data = self.stream.read(min(_PIECE, self.left))
        if not data:
            raise UploadError(400, f"request body ended after {self.length - self.left} of "
                                   f"{self.length} bytes (Content-Length)")
        self.left -= len(data)
        self.buf += data

    def _find(self, needle, limit):
        """Where ``needle`` starts in the buffer, reading on; -1 if not within ``limit`` bytes."""
        start = 0
        while True:
            i = self.buf.find(needle, start)
            if i >= 0:
                return i if i <= limit else -1
            if len(self.buf) > limit + len(needle):
                return -1
            start = max(0, len(self.buf) - len(needle) + 1)
            self._more()

    def _copy_until_delimiter(self, sink):
        keep = len(self.delim) - 1
        while True:
            i = self.buf.find(self.delim)
            if i >= 0:
                sink(self.buf[:i])
                del self.buf[:i + len(self.delim)]
                return
            if len(self.buf) > keep:
                n = len(self.buf) - keep
                sink(self.buf[:n])
                del self.buf[:n]
            self._more()

    def parse(self):
        self._copy_until_delimiter(lambda data: None)   # the preamble
        parts, fields = [], 0
        while True:
            while len(self.buf) < 2:
                self._more()
            if self.buf[:2] == b"--":
                break
            eol = self._find(b"\r\n", limit=256)
            if eol < 0 or self.buf[:eol].strip(b" \t"):
                raise UploadError(400, "malformed multipart body: text after a boundary on its line")
            del self.buf[:eol]   # keep the CRLF: an empty header block is then a plain CRLFCRLF
            end = self._find(b"\r\n\r\n", limit=self.limits.max_part_header_bytes + 2)
            if end < 0:
                raise UploadError(400, f"a part's header block is over {self.limits.max_part_header_bytes} bytes")
            headers = _parse_part_headers(bytes(self.buf[2:end]))
            del self.buf[:end + 4]
            part = self._part(headers)
            if part is None:
                self._copy_until_delimiter(lambda data: None)
                continue
            if part.filename is None:
                fields += 1
                if fields > _MAX_FIELDS:
                    raise UploadError(400, f"more than {_MAX_FIELDS} form fields")
            parts.append(part)
        while self.left > 0:   # the epilogue: read so that the connection stays in step
            self.buf.clear()
            self._more()
        return parts

    def _part(self, headers):
        if "content-disposition" not in headers:
            raise UploadError(400, "a multipart part has no Content-Disposition header")
        kind, params = _header_params(headers["content-disposition"])
        if kind != "form-data" or "name" not in params:
            raise UploadError(400, f"unexpected Content-Disposition {headers['content-disposition']!r}")
        field, raw_name = params["name"], _part_filename(params)
        if raw_name is None:
            value = bytearray()

            def add(data):
                value.extend(data)
                if len(value) > _MAX_FIELD_BYTES:
                    raise _too_big(f"form field {field!r} is over {_MAX_FIELD_BYTES // 1024} KiB")
            self._copy_until_delimiter(add)
            return UploadedPart(field, None, None, len(value), "", value.decode("utf-8", "replace"))
        if raw_name == "":
            return None   # a file input left empty
        name = safe_relative_path(raw_name)
        lim = self.limits
        archive = _archive_kind(name)
        reason = None if archive else _skip_reason(name)
        if reason is None:
            self.kept += 1
            if self.kept > lim.max_files:
                raise _too_many_files(lim)
        else:
            self.passed += 1
            if self.passed > _MEMBERS_PER_FILE * lim.max_files:
                raise _too_big(f"the upload holds more than {_MEMBERS_PER_FILE * lim.max_files} files of types "
                               f"that are not accepted ({_MEMBERS_PER_FILE} per file of uploads.max_files)")
        size = 0

        def count(data):
            nonlocal size
            size += len(data)
            self.total += len(data)
            if self.total > lim.max_total_bytes:
                raise _too_much(lim)
        if reason is not None:   # left out: its bytes are read past, never written
            self._copy_until_delimiter(count)
            return UploadedPart(field, name, None, size, "", skip=reason, skip_status=400)
        # An archive may be as large as a whole upload: its members are capped one by one later.
        # A file over the cap is dropped as it arrives and the rest of the upload still read.
        cap = lim.max_total_bytes if archive else lim.file_cap()
        out = _StagedFile(self.staging_dir, cap, lambda: _too_big(
            f"{name!r} is over {human_size(cap)} (uploads.max_total_bytes, for an archive)"))
        self.staged.append(out.path)

        def write(data):
            nonlocal out
            count(data)
            if out is None:
                return
            if not archive and size > cap:
                out.discard()
                out = None
                return
            out.write(data)
        try:
            self._copy_until_delimiter(write)
        except BaseException:
            if out is not None:
                out.file.close()
            raise
        if out is None:
            return UploadedPart(field, name, None, size, "", skip=lim.oversize_reason(size), skip_status=413)
        out.close()
        return UploadedPart(field, name, out.path, out.size, out.hash.hexdigest())


def _parse_part_headers(raw):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    headers = {}
    for line in text.split("\r\n") if text else ():
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or name[:1] in (" ", "\t"):
            raise UploadError(400, f"malformed multipart header line {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def parse_multipart(stream, content_type, content_length, staging_dir, limits=None):
    """Stream a multipart/form-data body into ``staging_dir``; a list of UploadedPart.

    Reads at most ``content_length`` bytes from ``stream``, 64 KiB at a time.
    File parts become new files in ``staging_dir``; on any error those are
    removed again.  An empty file input (``filename=""``) yields no part.
    """
    limits = limits or UploadLimits()
    kind, params = _header_params(content_type or "")
    if kind != "multipart/form-data":
        raise UploadError(400, f"expected a multipart/form-data upload, got {content_type or 'no Content-Type'!r}")
    boundary = params.get("boundary", "")
    if not 1 <= len(boundary) <= 70 or not boundary.isascii() or not boundary.isprintable():
        raise UploadError(400, "multipart/form-data Content-Type lacks a valid boundary parameter")
    if content_length is None or content_length == "":
        raise UploadError(411, "uploads need a Content-Length header")
    try:
        length = int(content_length)
    except (TypeError, ValueError):
        length = -1
    if length < 0:
        raise UploadError(400, f"invalid Content-Length {content_length!r}")
    # File bytes are capped at max_total_bytes; allow for part headers and small fields on top.
    overhead = (limits.max_files + _MAX_FIELDS + 1) * (limits.max_part_header_bytes + 256) + _MAX_FIELDS * 1024
    if length > limits.max_total_bytes + overhead:
        raise _too_big(f"the upload is {human_size(length)}, over {human_size(limits.max_total_bytes)} "
                       "(uploads.max_total_bytes)")
    parser = _Multipart(stream, length, boundary.encode("ascii"), staging_dir, limits)
    try:
        return parser.parse()
    except BaseException:
        for path in parser.staged:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise


# --- archives -------------------------------------------------------------------

@contextlib.contextmanager
def _archive_errors(display_name):
    """Reading errors of an archive are the upload's fault (400), not the server's."""
    try:
        yield
    except UploadError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, zlib.error,
            NotImplementedError, OSError, ValueError, struct.error) as e:
        raise UploadError(400, f"{display_name}: archive is truncated or corrupt: {e}") from None


def _verify_magic(path, kind, display_name):
    with open(path, "rb") as f:
        head = f.read(512)
    if kind == ".zip":
        ok = head[:4] in (b"PK\x03\x04", b"PK\x05\x06")
    elif kind == ".tar":
        ok = head[257:262] == b"ustar" or (len(head) == 512 and not any(head))
    else:
        ok = head[:2] == b"\x1f\x8b"
    if not ok:
        what = {".zip": "zip archive", ".tar": "tar archive"}.get(kind, "gzip-compressed tar archive")
        raise UploadError(400, f"{display_name!r} is not a {what}")


def _zip_declared_entries(path):
    """The entry count of the end-of-central-directory record, read before zipfile
    loads the whole central directory into memory; None if not found."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 65557))
        tail = f.read()
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) - i < 22:
        return None
    return struct.unpack("<H", tail[i + 10:i + 12])[0]


def _skip_reason(member):
    base = member.rsplit("/", 1)[-1]
    if member.startswith("__MACOSX/") or base.startswith("._"):
        return "macOS metadata"
    if _archive_kind(member):
        return "nested archive (not expanded)"
    ext = split_ext(member)[1]
    if not ext:
        return "no file extension"
    if ext not in ALLOWED_UPLOAD_EXTS:
        return f"file type {ext!r} is not accepted"
    return None


def _member_skip_reason(member, size, limits):
    """Why an archive member is left out (its type, or its declared size); None to store it."""
    reason = _skip_reason(member)
    if reason is None and size > limits.file_cap():
        reason = limits.oversize_reason(size)
    return reason


def _check_ratio(what, unpacked, packed, limits):
    if unpacked > _RATIO_FLOOR and unpacked > limits.max_ratio * max(packed, 1):
        ratio = unpacked / max(packed, 1)
        raise UploadError(400, f"{what} expands {ratio:.0f}x (limit {limits.max_ratio:.0f}x): "
                               "refusing a possible zip bomb")


def expand_archive(path, display_name, staging_dir, limits=None, budget=None):
    """Unpack a zip, tar or tar.gz into new files in ``staging_dir``.

    Returns ``(parts, skipped)``: UploadedPart per accepted member, named
    ``display_name/member``, and ``{"name", "reason"}`` per member left out.
    Anything unsafe rejects the whole archive with UploadError; files already
    written stay in ``staging_dir`` for the caller to remove with it.
    """
    limits = limits or UploadLimits()
    budget = budget if budget is not None else _Budget(limits)
    kind = _archive_kind(display_name)
    if kind is None:
        raise UploadError(400, f"{display_name!r} is not a .zip, .tar, .tar.gz or .tgz archive")
    _verify_magic(path, kind, display_name)
    with _archive_errors(display_name):
        if kind == ".zip":
            return _expand_zip(path, display_name, staging_dir, limits, budget)
        return _expand_tar(path, display_name, staging_dir, limits, budget, kind != ".tar")


def _too_many_members(display_name, count, limit):
    return _too_big(f"{display_name} has {count} members (limit {limit}: {_MEMBERS_PER_FILE} per file "
                    "of uploads.max_files, counting folders and skipped files)")


def _member_error(display_name, member, problem):
    return UploadError(400, f"{display_name}: archive member {member!r} {problem}")


def _extract_member(src, display_name, member, declared, staging_dir):
    """Copy one member out in pieces, refusing more bytes than its header declared."""
    name = f"{display_name}/{member}"
    out = _StagedFile(staging_dir, declared, lambda: _member_error(
        display_name, member, f"holds more than the {declared} bytes its header declares (corrupt or hostile)"))
    try:
        while True:
            piece = src.read(_PIECE)
            if not piece:
                break
            out.write(piece)
    except BaseException:
        out.file.close()
        raise
    out.close()
    return UploadedPart("", name, out.path, out.size, out.hash.hexdigest())


def _expand_zip(path, display_name, staging_dir, limits, budget):
    max_members = _MEMBERS_PER_FILE * limits.max_files
    declared = _zip_declared_entries(path)
    if declared is not None and declared > max_members:
        raise _too_many_members(display_name, declared, max_members)
    parts, skipped, todo = [], [], []
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > max_members:
            raise _too_many_members(display_name, len(infos), max_members)
        unpacked = 0
        for info in infos:   # every member is checked before anything is written
            mode = info.external_attr >> 16
            is_dir = info.is_dir() or (mode & _S_IFMT) == _S_IFDIR
            member = _member_path(display_name, info.filename, is_dir)
            if (mode & _S_IFMT) == _S_IFLNK:
                raise _member_error(display_name, info.filename, "is a symbolic link; links are not accepted")
            if is_dir:
                continue
            if (mode & _S_IFMT) not in (0, _S_IFREG):
                raise _member_error(display_name, info.filename, "is not a regular file")
            if info.flag_bits & 0x1:
                raise UploadError(400, f"{display_name}: zip member {member!r} is encrypted; upload it unencrypted")
            _check_ratio(f"{display_name}: zip member {member!r}", info.file_size, info.compress_size, limits)
            unpacked += info.file_size
            reason = _member_skip_reason(member, info.file_size, limits)
            if reason:
                skipped.append({"name": f"{display_name}/{member}", "reason": reason})
                continue
            budget.add(info.file_size)
            todo.append((info, member))
        _check_ratio(f"{display_name} as a whole", unpacked, os.path.getsize(path), limits)
        for info, member in todo:
            with zf.open(info) as src:
                parts.append(_extract_member(src, display_name, member, info.file_size, staging_dir))
    return parts, skipped


def _expand_tar(path, display_name, staging_dir, limits, budget, gzipped):
    max_members = _MEMBERS_PER_FILE * limits.max_files
    packed = os.path.getsize(path)
    parts, skipped, count = [], [], 0
    with open(path, "rb") as raw, (gzip.GzipFile(fileobj=raw) if gzipped else contextlib.nullcontext(raw)) as f:
        # Stream mode: one pass, no seeking, members are never all held at once.
        with tarfile.open(fileobj=f, mode="r|") as tf:
            for ti in tf:
                count += 1
                if count > max_members:
                    raise _too_many_members(display_name, f"more than {max_members}", max_members)
                member = _member_path(display_name, ti.name, ti.isdir())
                if ti.issym():
                    raise _member_error(display_name, ti.name, "is a symbolic link; links are not accepted")
                if ti.islnk():
                    raise _member_error(display_name, ti.name, "is a hard link; links are not accepted")
                if ti.isdir():
                    continue
                if ti.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
                    what = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
                            tarfile.FIFOTYPE: "a fifo", tarfile.GNUTYPE_SPARSE: "a sparse file"}
                    raise _member_error(display_name, ti.name, f"is {what.get(ti.type, 'not a regular file')}; "
                                                               "only regular files and folders are accepted")
                if gzipped:
                    _check_ratio(f"{display_name} as a whole", f.tell() + ti.size, packed, limits)
                reason = _member_skip_reason(member, ti.size, limits)
                if reason:
                    skipped.append({"name": f"{display_name}/{member}", "reason": reason})
                    continue
                budget.add(ti.size)
                parts.append(_extract_member(tf.extractfile(ti), display_name, member, ti.size, staging_dir))
        # tarfile stops at the end-of-archive blocks; reading on makes gzip check its length and CRC.
        while f.read(_PIECE):
            if gzipped:
                _check_ratio(f"{display_name} as a whole", f.tell(), packed, limits)
    return parts, skipped


class Uploads:
    """Stores uploads into documents folders; one per process, so that its locks
    serialize the manifest updates of each folder."""

    def __init__(self, limits=None, clock=time.time, new_id=None):
        self.limits = limits or UploadLimits()
        self.clock = clock
        self.new_id = new_id or (lambda: uuid.uuid4().hex)
        self._locks = {}
        self._locks_guard = threading.Lock()

    def _lock(self, documents_dir):
        key = os.path.normcase(os.path.realpath(documents_dir))
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def ingest(self, stream, content_type, content_length, documents_dir, limits=None):
        """Store one multipart upload in ``documents_dir``, all or nothing.

        Returns ``{"stored": [{name, stored_as, size, sha256, replaced}], "unchanged": [{name, stored_as,
        size, sha256}], "skipped": [{name, reason}]}``.  Files are known by their original relative
        name: the same name with the same content is ``unchanged`` (not stored again), the same
        name with new content replaces the stored file in place (``replaced``: same stored name).
        Files of a type not accepted or over the per-file cap are ``skipped`` with the reason,
        unless the upload is that one file: then it is refused (UploadError 400 or 413).
        ``limits`` (default: this Uploads' own) lets a caller apply the config of the moment.
        """
        limits = limits or self.limits
        documents_dir = os.path.abspath(documents_dir)
        created, path = [], documents_dir   # folders this upload makes, deepest first
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            created.append(path)
            path = os.path.dirname(path)
        os.makedirs(os.path.dirname(documents_dir), exist_ok=True)
        staging = os.path.join(os.path.dirname(documents_dir), _STAGING_PREFIX + uuid.uuid4().hex[:16])
        os.mkdir(staging, 0o700)
        moved, displaced = [], []   # files moved in; (stored file, its earlier contents set aside in staging)
        try:
            parts = parse_multipart(stream, content_type, content_length, staging, limits)
            files, skipped = self._expand(parts, staging, limits)
            with self._lock(documents_dir):
                os.makedirs(documents_dir, exist_ok=True)
                manifest, now = _manifest(documents_dir), self.clock()
                stored, unchanged, stale = [], [], []
                for part in files:
                    same_name = sorted((entry.get("uploaded_at") or 0, stored_as)
                                       for stored_as, entry in manifest.items()
                                       if isinstance(entry, dict) and entry.get("name") == part.filename
                                       and _plain_name(stored_as))
                    same = next((stored_as for _, stored_as in same_name
                                 if _holds(documents_dir, stored_as, manifest[stored_as], part)), None)
                    keep = same or (same_name[-1][1] if same_name else None)
                    stale += [stored_as for _, stored_as in same_name if stored_as != keep]
                    if same is not None:
                        os.unlink(part.path)
                        unchanged.append({"name": part.filename, "stored_as": same, "size": part.size,
                                          "sha256": part.sha256})
                        continue
                    stored_as = keep or self.new_id() + split_ext(part.filename)[1]
                    target = os.path.join(documents_dir, stored_as)
                    if not _plain_name(stored_as) or (keep is None and (stored_as in manifest
                                                                          or os.path.lexists(target))):
                        raise RuntimeError(f"upload id {stored_as!r} is taken or invalid")
                    os.chmod(part.path, 0o644)   # mkstemp made it private to this process's user
                    if keep is not None and os.path.isfile(target):
                        # A second name for the earlier contents, put back if the upload fails after
                        # all; the stored name itself is replaced in one rename, never missing.
                        aside = part.path + ".old"
                        try:
                            os.link(target, aside)
                        except OSError:
                            shutil.copy2(target, aside)
                        displaced.append((target, aside))
                    os.replace(part.path, target)
                    moved.append(target)
                    manifest[stored_as] = {"name": part.filename, "size": part.size, "sha256": part.sha256,
                                           "uploaded_at": now}
                    stored.append({"name": part.filename, "stored_as": stored_as, "size": part.size,
                                   "sha256": part.sha256, "replaced": keep is not None})
                for stored_as in stale:   # copies an earlier version stored twice: one name, one file
                    manifest.pop(stored_as, None)
                write_manifest(documents_dir, manifest)
                for stored_as in stale:   # after the manifest, as remove() does
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(documents_dir, stored_as))
            return {"stored": stored, "unchanged": unchanged, "skipped": skipped}
        except BaseException:
            with self._lock(documents_dir):
                for path in moved:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                for target, aside in displaced:
                    with contextlib.suppress(OSError):
                        os.replace(aside, target)
                shutil.rmtree(staging, ignore_errors=True)  # now, not in finally: it sits in a folder to remove
                for path in created:   # only folders this upload made, and only if still empty
                    with contextlib.suppress(OSError):
                        os.rmdir(path)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _expand(self, parts, staging, limits):
        budget = _Budget(limits)
        files, skipped, names = [], [], set()
        given = [part for part in parts if part.filename is not None]
        # One plain file is refused outright: there is no rest of the upload to store.
        alone = len(given) == 1 and not _archive_kind(given[0].filename)
        for part in given:
            if _archive_kind(part.filename):
                members, left_out = expand_archive(part.path, part.filename, staging, limits, budget)
                os.unlink(part.path)   # halves the staging space a large archive needs
                files += members
                skipped += left_out
                continue
            if part.skip and alone:
                raise UploadError(part.skip_status, _refusal(part))
            if part.skip:
                skipped.append({"name": part.filename, "reason": part.skip})
                continue
            budget.add(part.size)
            files.append(part)
        kept = []
        for part in files:
            if part.filename in names:
                os.unlink(part.path)
                skipped.append({"name": part.filename, "reason": "the upload holds another file of this name; "
                                                                 "the first one is kept"})
                continue
            names.add(part.filename)
            kept.append(part)
        if not kept:
            if not skipped:
                raise UploadError(400, "the upload holds no files")
            listed = "; ".join(f"{s['name']!r}: {s['reason']}" for s in skipped[:3])
            more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
            status = 413 if all(_OVERSIZE in s["reason"] for s in skipped) else 400
            raise UploadError(status, f"the upload holds no accepted documents: {listed}{more}")
        return kept, skipped

    def remove(self, documents_dir, stored_as):
        """Delete one stored document and its manifest entry; returns the entry."""
        if not isinstance(stored_as, str) or stored_as in ("", ".", "..", UPLOAD_MANIFEST) \
                or "/" in stored_as or "\\" in stored_as or "\0" in stored_as:
            raise UploadError(400, f"{stored_as!r} is not a stored document name")
        with self._lock(documents_dir):
            manifest = _manifest(documents_dir)
            entry = manifest.pop(stored_as, None)
            if entry is None:
                raise UploadError(400, f"{stored_as!r} is not in the upload manifest")
            write_manifest(documents_dir, manifest)   # first: a crash then leaves a stray file, not a dangling entry
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(documents_dir, stored_as))
        return entry


def _manifest(documents_dir):
    """The manifest to update; an unreadable one stops the change rather than being overwritten."""
    try:
        return read_manifest(documents_dir, strict=True)
    except ManifestError as e:
        raise UploadError(409, f"{e}; fix it or move it aside (uploads are refused meanwhile so that the "
                               "names of earlier uploads are not lost)") from None


def _refusal(part):
    """The error for an upload that is this one file, which would be skipped."""
    if part.skip_status == 413:
        return f"{part.filename!r} is {part.skip}"
    ext = split_ext(part.filename)[1]
    if ext and ext in ALLOWED_UPLOAD_EXTS:   # macOS metadata: an accepted extension, still no document
        return f"{part.filename!r}: {part.skip}, not a document"
    kind = f"file type {ext!r} is" if ext else "files without an extension are"
    return (f"{part.filename!r}: {kind} not accepted (upload documents such as .md, .txt, .pdf, .docx or "
            "source code, or .zip/.tar/.tar.gz archives)")


def _plain_name(stored_as):
    """A stored name from the manifest that names a file in the documents folder itself."""
    return isinstance(stored_as, str) and stored_as not in ("", ".", "..", UPLOAD_MANIFEST) \
        and not any(c in stored_as for c in "/\\\0")


def _holds(documents_dir, stored_as, entry, part):
    """Whether the stored file already holds ``part``'s contents.  The file itself is hashed, not
    only its manifest entry: a crash between moving a new version in and rewriting the manifest
    leaves an entry that describes the previous contents."""
    if entry.get("sha256") != part.sha256 or entry.get("size") != part.size:
        return False
    digest = hashlib.sha256()
    try:
        with open(os.path.join(documents_dir, stored_as), "rb") as f:
            for piece in iter(lambda: f.read(_PIECE), b""):
                digest.update(piece)
    except OSError:
        return False
    return digest.hexdigest() == part.sha256


def cleanup_staging(documents_root, older_than_s=3600, clock=time.time):
    """Remove staging folders that crashed uploads left in ``documents_root``; returns their names.

    A folder counts as abandoned when neither it nor any file in it (staging
    is flat) has changed for ``older_than_s``, so a slow live upload survives.
    """
    cutoff = clock() - older_than_s

    def abandoned(path):
        try:
            return max([os.stat(path).st_mtime] + [e.stat().st_mtime for e in os.scandir(path)]) < cutoff
        except OSError:
            return False

    return [os.path.basename(path) for path in remove_leftover_dirs(documents_root, _STAGING_PREFIX, abandoned)]
