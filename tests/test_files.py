"""File-system helpers (_ragproxy.files), in-process on real files under tmp_path.

atomic_write and atomic_file, temp_name_of, remove_leftover_dirs and
human_size.  A crash cannot be staged in-process, so the atomic writes are
checked by what one can observe: the temporary file's name while the block
runs, the old file untouched and nothing left behind when it fails.
"""
import os
import stat

import pytest

from _ragproxy import files


def mode_of(path):
    return stat.S_IMODE(os.stat(str(path)).st_mode)


def test_atomic_write_replaces_the_content_and_sets_the_mode(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_bytes(b"old contents, longer than the new ones")
    os.chmod(str(target), 0o644)
    files.atomic_write(str(target), b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert mode_of(target) == 0o600
    files.atomic_write(str(tmp_path / "fresh.txt"), b"x")   # a file that did not exist yet
    assert (tmp_path / "fresh.txt").read_bytes() == b"x" and mode_of(tmp_path / "fresh.txt") == 0o644
    assert sorted(os.listdir(str(tmp_path))) == ["config.yaml", "fresh.txt"]


def test_a_failing_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "state.json"
    target.write_bytes(b'{"old": true}')
    with pytest.raises(RuntimeError, match="disk on fire"):
        with files.atomic_file(str(target)) as f:
            f.write(b'{"new": tr')
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b'{"old": true}'
    assert os.listdir(str(tmp_path)) == ["state.json"]     # no .state.json.*.tmp behind


def test_temp_name_of_is_how_the_temporary_file_begins(tmp_path):
    target = tmp_path / "vectors.npy"
    with files.atomic_file(str(target)) as f:
        f.write(b"rows")
        during = os.listdir(str(tmp_path))
    assert len(during) == 1
    (temp,) = during
    assert temp.startswith(files.temp_name_of("vectors.npy")) and temp.endswith(".tmp")
    assert files.temp_name_of("vectors.npy") == ".vectors.npy."
    assert os.listdir(str(tmp_path)) == ["vectors.npy"] and target.read_bytes() == b"rows"


def test_without_fsync_the_file_is_still_replaced_atomically(tmp_path):
    target = tmp_path / "chunks.jsonl"
    target.write_bytes(b"old\n")
    with files.atomic_file(str(target), fsync=False) as f:
        f.write(b"new\n")
        assert target.read_bytes() == b"old\n"     # not touched until the block ends
    assert target.read_bytes() == b"new\n"
    assert os.listdir(str(tmp_path)) == ["chunks.jsonl"]


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 * 1024 ** 2, "5.0 MiB"),
    (5 * 1024 ** 3, "5.0 GiB"), (3 * 1024 ** 4, "3072.0 GiB"),  # GiB is the largest unit
])
def test_human_size(n, text):
    assert files.human_size(n) == text


def test_remove_leftover_dirs_removes_only_prefixed_abandoned_dirs_and_never_follows_a_symlink(tmp_path):
    root = tmp_path / "vectordb"
    for name in (".tmp-old", ".tmp-live", "g000001"):
        (root / name).mkdir(parents=True)
        (root / name / "file").write_bytes(b"x")
    (root / ".tmp-file").write_bytes(b"a file, not a folder")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"keep me")
    os.symlink(str(elsewhere), str(root / ".tmp-link"))
    asked = []

    def abandoned(path):
        asked.append(os.path.basename(path))
        return not path.endswith("live")

    removed = files.remove_leftover_dirs(str(root), ".tmp-", abandoned)
    assert removed == [str(root / ".tmp-old")]
    assert sorted(os.listdir(str(root))) == [".tmp-file", ".tmp-link", ".tmp-live", "g000001"]
    assert (elsewhere / "precious").read_bytes() == b"keep me"
    assert sorted(asked) == [".tmp-live", ".tmp-old"]    # neither the file nor the symlink was offered
    assert files.remove_leftover_dirs(str(tmp_path / "missing"), ".tmp-") == []
