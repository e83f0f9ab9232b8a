"""numpy's .npy format (version 1.0), written and read with or without numpy.

The vector store keeps its vectors in it and the BM25 index its postings, so
plain tools (numpy.load) read both, and the pure-stdlib mode writes files
byte-identical to numpy's.  StoreError, raised for a missing, corrupt or
misused file, is the store's error too.

May import: deps, files.
"""
from __future__ import annotations

import array
import ast
import contextlib
import mmap
import os
import struct
import sys

from . import deps
from .files import atomic_file


class StoreError(Exception):
    """A knowledge-base directory or .npy file is missing, corrupt or misused."""


_NPY_MAGIC = b"\x93NUMPY"
# descr -> (array typecode or None, struct code, item size).  float16 has no
# array typecode and memoryview only casts to "e" from Python 3.12, so it goes
# through struct, which also fixes byte order on big-endian hosts.
_NPY_DTYPES = {
    "<f4": ("f", "f", 4),
    "<f2": (None, "e", 2),
    "<i4": ("i", "i", 4),
    "<i8": ("q", "q", 8),
    "|i1": ("b", "b", 1),
    "|u1": ("B", "B", 1),
}
_NPY_LITTLE = sys.byteorder == "little"
# Fixed header size for files whose row count is unknown until they are closed;
# a multiple of 64 like numpy's own headers, and roomy enough for any shape.
_NPY_STREAM_HEADER = 128


def _npy_header(descr, shape, total=None):
    dims = ", ".join(str(int(d)) for d in shape)
    if len(shape) == 1:
        dims += ","
    text = "{'descr': %r, 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    used = len(_NPY_MAGIC) + 4 + len(text) + 1
    if total is None:
        total = -(-used // 64) * 64
    elif used > total:
        raise StoreError("npy header for shape %r does not fit in %d bytes" % (shape, total))
    text += " " * (total - used) + "\n"
    return _NPY_MAGIC + b"\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin-1")


def _npy_read_header(f, path):
    """Return (descr, shape, data_offset) from an open .npy file."""
    lead = f.read(12)
    if lead[:6] != _NPY_MAGIC or len(lead) < 10:
        raise StoreError("%s: not a .npy file" % path)
    major = lead[6]
    if major == 1:
        hlen, start = struct.unpack_from("<H", lead, 8)[0], 10
    elif major in (2, 3):
        hlen, start = struct.unpack_from("<I", lead, 8)[0], 12
    else:
        raise StoreError("%s: unsupported .npy version %d" % (path, major))
    f.seek(start)
    raw = f.read(hlen)
    if len(raw) != hlen:
        raise StoreError("%s: truncated .npy header" % path)
    try:
        header = ast.literal_eval(raw.decode("utf-8" if major == 3 else "latin-1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise StoreError("%s: bad .npy header: %s" % (path, e)) from None
    if descr == "<i1":  # numpy spells one-byte types with "|", accept both
        descr = "|i1"
    if descr not in _NPY_DTYPES:
        raise StoreError("%s: unsupported dtype %r (supported: %s)"
                         % (path, descr, ", ".join(sorted(_NPY_DTYPES))))
    if fortran and len(shape) > 1:
        raise StoreError("%s: Fortran-order arrays are not supported" % path)
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise StoreError("%s: bad shape %r" % (path, shape))
    return descr, shape, start + hlen


def _pack_values(values, descr):
    """Little-endian bytes of a flat sequence of numbers in dtype `descr`."""
    code, scode, size = _NPY_DTYPES[descr]
    if code is not None:
        packed = array.array(code, values)
        if packed.itemsize == size:
            if not _NPY_LITTLE:
                packed.byteswap()
            return packed.tobytes()
    values = values if isinstance(values, (list, tuple)) else list(values)
    return struct.pack("<%d%s" % (len(values), scode), *values)


class NpyAppender:
    """Write a C-order .npy file row by row; the shape goes in at close().

    The header is reserved at a fixed size up front so rows can stream to disk
    (a million 384-float vectors do not have to sit in memory) and the final
    row count is patched in place.
    """

    def __init__(self, path, descr, row_dim=None):
        if descr not in _NPY_DTYPES:
            raise ValueError("unsupported dtype %r" % descr)
        self.path, self.descr, self.row_dim = path, descr, row_dim
        self.rows = 0
        self._f = open(path, "wb")
        self._f.write(b"\0" * _NPY_STREAM_HEADER)

    def append(self, rows):
        """Append rows: a 2-D numpy array, sequences of numbers, or (1-D files) numbers."""
        np = deps.np
        if np is not None and isinstance(rows, np.ndarray):
            arr = np.ascontiguousarray(rows, dtype=np.dtype(self.descr))
            if self.row_dim is None:
                if arr.ndim != 1:
                    raise ValueError("expected a 1-D array, got shape %r" % (arr.shape,))
            elif arr.ndim != 2 or arr.shape[1] != self.row_dim:
                raise ValueError("expected rows of %d values, got shape %r" % (self.row_dim, arr.shape))
            self._f.write(arr.tobytes())
            self.rows += arr.shape[0]
            return
        if self.row_dim is None:
            values = list(rows)
            self._f.write(_pack_values(values, self.descr))
            self.rows += len(values)
            return
        for row in rows:
            if len(row) != self.row_dim:
                raise ValueError("expected rows of %d values, got %d" % (self.row_dim, len(row)))
            self._f.write(_pack_values(row, self.descr))
            self.rows += 1

    def append_raw(self, data, nrows):
        """Append bytes already in this file's dtype and byte order."""
        self._f.write(data)
        self.rows += nrows

    def close(self):
        """Write the final header and close; the caller fsyncs."""
        shape = (self.rows,) if self.row_dim is None else (self.rows, self.row_dim)
        self._f.seek(0)
        self._f.write(_npy_header(self.descr, shape, _NPY_STREAM_HEADER))
        self._f.close()
        return shape

    def discard(self):
        self._f.close()


# Short spellings accepted for `dtype`: array/struct typecodes, and numpy's "<i1".
_NPY_ALIASES = {"f": "<f4", "e": "<f2", "i": "<i4", "q": "<i8", "b": "|i1", "<i1": "|i1", "B": "|u1", "<u1": "|u1"}


def _npy_dtype_of(data, dtype):
    """The .npy descr to write `data` as: `dtype` (or an alias), else data's own."""
    np = deps.np
    if dtype is None:
        if np is not None and isinstance(data, np.ndarray):
            dtype = data.dtype.str
        elif isinstance(data, array.array):
            dtype = {"f": "<f4", "i": "<i4", "q": "<i8", "b": "|i1"}.get(data.typecode)
        elif isinstance(data, NpyArray):
            dtype = data.descr
        if dtype is None:
            raise ValueError("give dtype for data of type %s" % type(data).__name__)
    dtype = _NPY_ALIASES.get(dtype, dtype)
    if dtype not in _NPY_DTYPES:
        raise ValueError("unsupported dtype %r (supported: %s)" % (dtype, ", ".join(sorted(_NPY_DTYPES))))
    return dtype


def npy_write_array(path, array_or_rows, dtype="<f4", shape=None, fsync=True):
    """Write `array_or_rows` to `path` as a C-order .npy v1.0 file; return its shape.

    `array_or_rows` is a numpy array, an array.array, a sequence of rows
    (2-D), a flat sequence of numbers (1-D, or any shape given by `shape`), or
    an array returned by _npy_read_array.  `dtype` is "<f4", "<f2", "<i4",
    "<i8" or "|i1" (or "f", "e", "i", "q", "b"; None takes the data's own).
    The file is replaced atomically, and fsynced unless `fsync` is false.
    """
    dtype = _npy_dtype_of(array_or_rows, dtype)
    with atomic_file(path, fsync=fsync) as f:
        return _npy_write_to(f, array_or_rows, dtype, shape)


def _npy_write_to(f, array_or_rows, dtype, shape):
    np = deps.np
    if np is not None:
        if isinstance(array_or_rows, NpyArray):
            array_or_rows = array_or_rows.tolist()
        arr = np.asarray(array_or_rows, dtype=np.dtype(dtype))
        if shape is not None:
            arr = arr.reshape(shape)
        arr = np.ascontiguousarray(arr)
        np.save(f, arr, allow_pickle=False)
        return tuple(arr.shape)
    src = array_or_rows
    if isinstance(src, NpyArray):
        if src.descr == dtype:
            return _npy_write_bytes(f, dtype, src.shape if shape is None else tuple(shape), src.raw_bytes())
        src = src.tolist()
    if not isinstance(src, (list, tuple, array.array)):
        src = list(src)
    flat = not src or isinstance(src[0], (int, float))
    if shape is None:
        shape = (len(src),) if flat else (len(src), len(src[0]))
    shape = tuple(int(d) for d in shape)
    count = 1
    for d in shape:
        count *= d
    if flat:
        data, seen = _pack_values(src, dtype), len(src)
    else:
        width = shape[-1] if len(shape) > 1 else None
        for row in src:
            if width is not None and len(row) != width:
                raise ValueError("row of %d values does not match shape %r" % (len(row), shape))
        data = b"".join(_pack_values(row, dtype) for row in src)
        seen = sum(len(row) for row in src)
    if seen != count:
        raise ValueError("%d values do not fill shape %r" % (seen, shape))
    return _npy_write_bytes(f, dtype, shape, data)


def _npy_write_bytes(f, descr, shape, data):
    f.write(_npy_header(descr, shape))
    f.write(data)
    return tuple(shape)


def npy_read_array(path, mmap=True):
    """Open a .npy file: a read-only numpy memmap, or an _NpyArray without numpy."""
    np = deps.np
    if np is not None:
        with open(path, "rb") as f:  # np.load would take anything else for a pickle
            if f.read(6) != _NPY_MAGIC:
                raise StoreError("%s: not a .npy file" % path)
        try:
            arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, EOFError) as e:
            raise StoreError("%s: cannot load: %s" % (path, e)) from None
        if arr.dtype.str not in _NPY_DTYPES and arr.dtype.str != "<i1":
            raise StoreError("%s: unsupported dtype %r" % (path, arr.dtype.str))
        return arr
    return NpyArray(path, use_mmap=mmap)


class NpyArray:
    """Read-only C-order .npy array without numpy: len(), [i], row(i), tolist().

    The data is memory-mapped, so opening a million-row file costs the same as
    a ten-row one; rows are decoded only when touched.
    """

    def __init__(self, path, use_mmap=True):
        self.path = path
        self._mm = None
        with open(path, "rb") as f:
            self.descr, self.shape, offset = _npy_read_header(f, path)
            code, scode, self.itemsize = _NPY_DTYPES[self.descr]
            count = 1
            for d in self.shape:
                count *= d
            nbytes = count * self.itemsize
            size = os.fstat(f.fileno()).st_size
            if size < offset + nbytes:
                raise StoreError("%s: truncated: %d data bytes, expected %d"
                                 % (path, size - offset, nbytes))
            if use_mmap and nbytes:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                self._buf = memoryview(self._mm)[offset:offset + nbytes]
            else:
                f.seek(offset)
                self._buf = memoryview(f.read(nbytes))
        self.ndim = len(self.shape)
        self.dim = self.shape[1] if self.ndim == 2 else 1
        self._row_bytes = self.dim * self.itemsize
        self._row = struct.Struct("<%d%s" % (self.dim, scode))
        self._item = struct.Struct("<" + scode)
        # A native-typed flat view is the fastest way to slice rows; struct
        # is the fallback for float16 before 3.12 and for big-endian hosts.
        self.flat = None
        if _NPY_LITTLE and code is not None and self.ndim in (1, 2):
            with contextlib.suppress(TypeError, ValueError):
                self.flat = self._buf.cast(code)

    def __len__(self):
        return self.shape[0] if self.shape else 1

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row %d out of range for %d rows" % (i, n))
        if self.ndim == 2:
            return self.row(i)
        if self.flat is not None:
            return self.flat[i]
        return self._item.unpack_from(self._buf, i * self.itemsize)[0]

    def __iter__(self):
        if self.ndim == 2:
            return iter(self._row.iter_unpack(self._buf)) if self._row_bytes else iter([()] * len(self))
        if self.flat is not None:
            return iter(self.flat)
        return (v[0] for v in self._item.iter_unpack(self._buf))

    def row(self, i):
        """Row i as a sequence of numbers (a memoryview slice or a tuple)."""
        if self.flat is not None:
            return self.flat[i * self.dim:(i + 1) * self.dim]
        return self._row.unpack_from(self._buf, i * self._row_bytes)

    def row_bytes(self, i):
        return bytes(self._buf[i * self._row_bytes:(i + 1) * self._row_bytes])

    def raw_bytes(self):
        return bytes(self._buf)

    def tolist(self):
        if self.ndim == 2:
            return [list(r) for r in self]
        return list(self)

    def close(self):
        for view in (self.flat, self._buf):
            if view is not None:
                view.release()
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a row view
                self._mm.close()


def npy_read_flat(path):
    """``(array.array, shape)`` of a whole .npy file, without numpy (one read, no mmap)."""
    with open(path, "rb") as f:
        descr, shape, offset = _npy_read_header(f, path)
        code, _, size = _NPY_DTYPES[descr]
        count = 1
        for d in shape:
            count *= d
        f.seek(offset)
        payload = f.read(count * size)
    if code is None or len(payload) != count * size:
        raise StoreError("%s: truncated or not an int/float32 .npy file" % path)
    data = array.array(code)
    data.frombytes(payload)
    if not _NPY_LITTLE:
        data.byteswap()
    return data, shape
