"""numpy's .npy format (_ragproxy.npy): npy_write_array, npy_read_array, npy_read_flat and NpyArray, in-process.

Every case runs with numpy and without it (the ``mode`` and ``pure``
fixtures switch ``deps.np`` off), and where numpy is importable the files
are checked against numpy's own: what the pure writer writes numpy.load
reads bit-exact, and what numpy.save wrote the pure reader reads.
"""
import array
import os
import struct

import pytest
import test_bm25
from test_bm25 import needs_numpy, numpy

import ragproxy
from _ragproxy import deps, npy

pure = test_bm25.pure   # the fixture: read and write without numpy

NPY_CASES = [
    ("<f4", [[1.5, -2.25, 3.0e-7], [0.0, 1.0e20, -0.125]]),
    ("<f2", [[1.5, -2.25, 0.0999755859375], [0.0, 65504.0, -0.125]]),
    ("<i4", [[1, -2, 2**31 - 1], [-2**31, 0, 7]]),
    ("<i8", [0, 5, 2**40, -3, 2**63 - 1]),
    ("|i1", [[-128, 127, 0, 5]]),
    ("<f4", []),
]


@pytest.mark.parametrize("dtype,values", NPY_CASES)
def test_npy_written_without_numpy_loads_in_numpy_bit_exact(tmp_path, monkeypatch, dtype, values):
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(deps, "np", None)
    path = str(tmp_path / "a.npy")
    npy.npy_write_array(path, values, dtype)
    loaded = np.load(path)
    expected = np.asarray(values, dtype=np.dtype(dtype))
    assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
    assert loaded.tobytes() == expected.tobytes()
    # Same header layout as numpy's own writer, so the files are identical.
    np.save(str(tmp_path / "b.npy"), expected)
    assert open(path, "rb").read() == open(str(tmp_path / "b.npy"), "rb").read()


def test_npy_empty_2d_shape_round_trip(tmp_path, mode):
    path = str(tmp_path / "e.npy")
    npy.npy_write_array(path, [], "<f4", shape=(0, 384))
    arr = npy.npy_read_array(path)
    assert len(arr) == 0 and tuple(arr.shape) == (0, 384)


@pytest.mark.parametrize("dtype,values", NPY_CASES)
@pytest.mark.parametrize("use_mmap", [True, False])
def test_npy_written_by_numpy_reads_without_numpy(tmp_path, monkeypatch, dtype, values, use_mmap):
    np = pytest.importorskip("numpy")
    expected = np.asarray(values, dtype=np.dtype(dtype))
    path = str(tmp_path / "a.npy")
    np.save(path, expected)
    monkeypatch.setattr(deps, "np", None)
    arr = npy.npy_read_array(path, mmap=use_mmap)
    assert tuple(arr.shape) == expected.shape
    assert arr.raw_bytes() == expected.tobytes()
    assert arr.tolist() == expected.tolist()
    if expected.ndim == 2 and len(expected):
        assert list(arr.row(len(expected) - 1)) == expected[-1].tolist()
    elif expected.ndim == 1 and len(expected):
        assert arr[-1] == expected[-1]


def test_npy_pure_writer_accepts_reader_arrays_and_flat_with_shape(tmp_path, mode):
    src = str(tmp_path / "src.npy")
    npy.npy_write_array(src, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "<f4", shape=(2, 3))
    arr = npy.npy_read_array(src)
    assert [list(map(float, r)) for r in arr] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    copy = str(tmp_path / "copy.npy")
    npy.npy_write_array(copy, arr, "<f4")
    assert open(copy, "rb").read() == open(src, "rb").read()


def test_npy_rejects_truncated_and_foreign_files(tmp_path, mode):
    path = str(tmp_path / "t.npy")
    npy.npy_write_array(path, [[1.0] * 8] * 4, "<f4")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-5])
    with pytest.raises(ragproxy.StoreError):
        npy.npy_read_array(path)
    open(path, "wb").write(b"not an npy file at all")
    with pytest.raises(ragproxy.StoreError, match="not a .npy file"):
        npy.npy_read_array(path)


def test_npy_dtype_aliases_and_inference(tmp_path, mode):
    import array
    path = str(tmp_path / "a.npy")
    assert npy.npy_write_array(path, array.array("i", [3, -4, 5]), None) == (3,)
    arr = npy.npy_read_array(path)
    assert [int(x) for x in arr] == [3, -4, 5]
    npy.npy_write_array(path, [0.5, 0.25], "f")
    assert [float(x) for x in npy.npy_read_array(path)] == [0.5, 0.25]
    assert sorted(os.listdir(str(tmp_path))) == ["a.npy"]  # no temp file left behind


def test_npy_rejects_unknown_dtype(tmp_path, mode):
    with pytest.raises(ValueError, match="unsupported dtype"):
        npy.npy_write_array(str(tmp_path / "x.npy"), [1, 2], "<u2")


def test_npy_shape_mismatch_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(deps, "np", None)
    with pytest.raises(ValueError):
        npy.npy_write_array(str(tmp_path / "x.npy"), [[1.0, 2.0], [3.0]], "<f4")


def test_npy_round_trip_without_numpy(tmp_path, pure):
    path = str(tmp_path / "a.npy")
    npy.npy_write_array(path, [1, -2, 3, 2 ** 31 - 1], "<i4")
    data, shape = npy.npy_read_flat(path)
    assert (data.typecode, shape, list(data)) == ("i", (4,), [1, -2, 3, 2 ** 31 - 1])
    assert list(npy.npy_read_array(path)) == list(data)
    npy.npy_write_array(path, array.array("f", [0.5, 1.5, -2.0, 8.0, 0.0, 1.0]),
                              shape=(2, 3), fsync=False)
    data, shape = npy.npy_read_flat(path)
    assert (data.typecode, shape, list(data)) == ("f", (2, 3), [0.5, 1.5, -2.0, 8.0, 0.0, 1.0])
    with open(path, "rb") as f:
        head = f.read(10)
    # Format 1.0, and the data starts on a 64-byte boundary as numpy writes it.
    assert head[:8] == b"\x93NUMPY\x01\x00"
    assert (10 + struct.unpack("<H", head[8:10])[0]) % 64 == 0
    with pytest.raises(ValueError):
        npy.npy_write_array(path, [1.5], "<f8")
    with pytest.raises(ValueError):
        npy.npy_write_array(path, [1, 2, 3], "i", shape=(2, 2))


@needs_numpy
def test_npy_files_interoperate_with_numpy(tmp_path, monkeypatch):
    ours = str(tmp_path / "ours.npy")
    with monkeypatch.context() as m:
        m.setattr(deps, "np", None)
        npy.npy_write_array(ours, array.array("f", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                                  shape=(3, 2))
    loaded = numpy.load(ours)
    assert loaded.dtype == numpy.float32 and loaded.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert npy.npy_read_array(ours).tolist() == [[1, 2], [3, 4], [5, 6]]

    theirs = str(tmp_path / "theirs.npy")
    numpy.save(theirs, numpy.arange(12, dtype="<i4").reshape(3, 4))
    data, shape = npy.npy_read_flat(theirs)
    assert (shape, list(data)) == ((3, 4), list(range(12)))
    data = npy.npy_read_array(theirs)
    assert isinstance(data, numpy.memmap) and data.tolist()[2] == [8, 9, 10, 11]


def test_npy_read_rejects_other_files(tmp_path):
    path = tmp_path / "x.npy"
    path.write_bytes(b"not an array")
    with pytest.raises(ragproxy.StoreError):
        npy.npy_read_flat(str(path))
    with pytest.raises(ragproxy.StoreError):
        npy.npy_read_array(str(path))
    npy.npy_write_array(str(path), [1, 2, 3], "<i4")
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ragproxy.StoreError, match="truncated"):
        npy.npy_read_flat(str(path))
