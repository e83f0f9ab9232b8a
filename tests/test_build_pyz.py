"""tools/build_pyz.py: a reproducible, runnable dist/ragproxy.pyz.

Builds go to temporary directories through the tool's command line, as a
maintainer runs it; the archive is then run the way a user runs it, with its
cache directory (tools/pyz_main.py) in conftest's temporary XDG_CACHE_HOME.
"""
import glob
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "build_pyz.py")
BOOTSTRAP = os.path.join(ROOT, "tools", "pyz_main.py")
VERSION = re.search(r'^__version__ = "([^"]+)"', open(os.path.join(ROOT, "_ragproxy", "__init__.py")).read(),
                    re.M).group(1)


def _env(**changes):
    env = {k: v for k, v in os.environ.items() if k not in ("SOURCE_DATE_EPOCH", "RAGPROXY_PURE")}
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def fake_checkout(root, main_py):
    """A checkout whose ragproxy.py is ``main_py``, with the smallest package the build accepts."""
    (root / "_ragproxy").mkdir(parents=True)
    (root / "_ragproxy" / "__init__.py").write_text('__version__ = "9.9"\n')
    (root / "ragproxy.py").write_text(main_py)


def build(out, *extra, python=sys.executable, **env):
    proc = subprocess.run([python, TOOL, "--out", str(out)] + list(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          env=_env(**env))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sha256(path):
    with open(str(path), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def source_files(root, tree):
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, tree)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        out += [os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                for f in filenames if not f.endswith(".pyc")]
    return out


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "ragproxy.pyz"
    build(out)
    return out


def test_two_builds_are_byte_identical(pyz, tmp_path):
    again = tmp_path / "elsewhere" / "ragproxy.pyz"
    build(again)
    assert sha256(again) == sha256(pyz)
    assert again.read_bytes() == pyz.read_bytes()


@pytest.mark.parametrize("minor", ["3.9", "3.13"])
def test_oldest_and_newest_python_build_the_same_bytes(pyz, tmp_path, minor):
    found = glob.glob("/root/.pyenv/versions/%s.*/bin/python3" % minor)
    if not found:
        pytest.skip("Python %s is not installed here" % minor)
    out = tmp_path / "ragproxy.pyz"
    build(out, python=found[0])
    assert sha256(out) == sha256(pyz)


def test_source_mtimes_and_caches_do_not_change_the_bytes(pyz, tmp_path):
    # A fresh checkout has new mtimes, and running it leaves __pycache__ behind.
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(os.path.join(ROOT, "ragproxy.py"), str(root / "ragproxy.py"))
    for tree in ("_ragproxy", "vendored"):
        shutil.copytree(os.path.join(ROOT, tree), str(root / tree), ignore=shutil.ignore_patterns("__pycache__"))
    if os.path.isdir(os.path.join(ROOT, "static")):
        shutil.copytree(os.path.join(ROOT, "static"), str(root / "static"))
    for cache in (root / "vendored" / "yaml" / "__pycache__", root / "_ragproxy" / "__pycache__"):
        cache.mkdir()
        (cache / "reader.cpython-311.pyc").write_bytes(b"cache")
    (root / "vendored" / "stray.pyc").write_bytes(b"cache")
    later = time.time() + 86400
    for dirpath, _, filenames in os.walk(str(root)):
        for f in filenames:
            os.utime(os.path.join(dirpath, f), (later, later))
    os.chmod(str(root / "ragproxy.py"), 0o700)
    out = tmp_path / "ragproxy.pyz"
    build(out, "--root", str(root))
    assert sha256(out) == sha256(pyz)


def test_output_line_gives_path_size_and_sha256(tmp_path):
    out = tmp_path / "x.pyz"
    line = build(out).strip()
    assert line == "%s  %d bytes  sha256 %s" % (out, out.stat().st_size, sha256(out))


def test_members_are_ragproxy_its_package_vendored_and_main(pyz):
    with zipfile.ZipFile(str(pyz)) as zf:
        names = zf.namelist()
    expected = ["__main__.py", "ragproxy.py"] + source_files(ROOT, "_ragproxy") + source_files(ROOT, "vendored") \
        + source_files(ROOT, "static")
    assert names == sorted(expected)
    assert "vendored/vendor.txt" in names and "vendored/LICENSE.PyYAML" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_entries_have_fixed_metadata_and_round_trip(pyz):
    with zipfile.ZipFile(str(pyz)) as zf:
        for info in zf.infolist():
            assert info.date_time == (1980, 1, 1, 0, 0, 0), info.filename
            assert info.external_attr >> 16 == 0o100644, info.filename
            assert info.create_system == 3, info.filename  # "Unix", whatever OS built it
            assert info.compress_type == zipfile.ZIP_DEFLATED, info.filename
        assert zf.read("ragproxy.py") == open(os.path.join(ROOT, "ragproxy.py"), "rb").read()
        assert zf.read("vendored/yaml/__init__.py") == \
            open(os.path.join(ROOT, "vendored", "yaml", "__init__.py"), "rb").read()
        assert zf.read("_ragproxy/cli.py") == open(os.path.join(ROOT, "_ragproxy", "cli.py"), "rb").read()


def test_main_is_the_bootstrap_with_this_builds_values(pyz):
    with zipfile.ZipFile(str(pyz)) as zf:
        main = zf.read("__main__.py").decode("utf-8")
        code = sorted(n for n in zf.namelist() if n == "ragproxy.py" or n.startswith(("_ragproxy/", "static/")))
    build_id = re.search(r"^BUILD = '([0-9a-f]{16})'$", main, re.M).group(1)
    assert re.search(r"^VERSION = '%s'$" % re.escape(VERSION), main, re.M)
    assert re.search(r"^PACKAGE_FILES = (.*)$", main, re.M).group(1) == repr(tuple(code))
    unfilled = re.sub(r"^VERSION = .*$", 'VERSION = "0"', main, flags=re.M)
    unfilled = re.sub(r"^BUILD = .*$", 'BUILD = "unbuilt"', unfilled, flags=re.M)
    unfilled = re.sub(r"^PACKAGE_FILES = .*$", "PACKAGE_FILES = ()", unfilled, flags=re.M)
    assert unfilled == open(BOOTSTRAP, encoding="utf-8").read()
    assert build_id not in open(os.path.join(ROOT, "_ragproxy", "__init__.py")).read()


def test_file_is_an_executable_script(pyz):
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert stat.S_IMODE(pyz.stat().st_mode) == 0o755


def test_source_date_epoch_sets_entry_times(tmp_path):
    out = tmp_path / "dated.pyz"
    build(out, SOURCE_DATE_EPOCH="1700000000")  # 2023-11-14 22:13:20 UTC
    with zipfile.ZipFile(str(out)) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def test_bad_source_date_epoch_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, TOOL, "--out", str(tmp_path / "x.pyz")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          env=_env(SOURCE_DATE_EPOCH="yesterday"))
    assert proc.returncode == 1
    assert proc.stderr == "build_pyz: error: SOURCE_DATE_EPOCH must be an integer, got 'yesterday'\n"
    assert not (tmp_path / "x.pyz").exists()


def test_missing_ragproxy_py_is_a_clear_error(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    proc = subprocess.run([sys.executable, TOOL, "--root", str(root), "--out", str(root / "x.pyz")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=_env())
    assert proc.returncode == 1
    assert "ragproxy.py not found" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(str(root)) == []


def test_missing_package_version_is_a_clear_error(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "ragproxy.py").write_text("def main():\n    return 0\n")
    for package_init in (None, "VERSION = 1\n"):
        if package_init is not None:
            (root / "_ragproxy").mkdir()
            (root / "_ragproxy" / "__init__.py").write_text(package_init)
        proc = subprocess.run([sys.executable, TOOL, "--root", str(root), "--out", str(tmp_path / "x.pyz")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=_env())
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert ("not found" if package_init is None else "does not set __version__") in proc.stderr
        assert not (tmp_path / "x.pyz").exists()


def test_static_tree_is_packed_when_present(tmp_path):
    root = tmp_path / "checkout"
    fake_checkout(root, "def main():\n    return 0\n")
    (root / "static" / "css").mkdir(parents=True)
    (root / "static" / "index.html").write_text("<!doctype html>")
    (root / "static" / "css" / "site.css").write_text("body{}")
    out = tmp_path / "ragproxy.pyz"
    build(out, "--root", str(root))
    with zipfile.ZipFile(str(out)) as zf:
        assert zf.namelist() == ["__main__.py", "_ragproxy/__init__.py", "ragproxy.py", "static/css/site.css",
                                 "static/index.html"]
    assert subprocess.run([sys.executable, str(out)]).returncode == 0


def test_main_exit_status_is_the_process_status(tmp_path):
    root = tmp_path / "checkout"
    fake_checkout(root, "import sys\ndef main():\n    print(sys.argv[1:])\n    return 3\n")
    out = tmp_path / "ragproxy.pyz"
    build(out, "--root", str(root))
    proc = subprocess.run([str(out), "--flag"], stdout=subprocess.PIPE, universal_newlines=True)
    assert (proc.returncode, proc.stdout) == (3, "['--flag']\n")


def test_pyz_version_runs(pyz):
    proc = subprocess.run([sys.executable, str(pyz), "--version"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ragproxy %s" % VERSION)


_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from _ragproxy import deps
print(deps.yaml and deps.yaml.__file__)
print(deps.urllib3 and deps.urllib3.__file__)
print(deps.pypdf and deps.pypdf.__file__)
"""


def test_vendored_packages_load_from_inside_the_archive(pyz):
    # -S hides site-packages, so only the copies inside the .pyz can answer.
    proc = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(pyz)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=_env())
    assert proc.returncode == 0, proc.stderr
    inside = os.path.join(str(pyz), "vendored")
    assert proc.stdout.split("\n")[:3] == [
        os.path.join(inside, "yaml", "__init__.py"),
        os.path.join(inside, "urllib3", "__init__.py"),
        os.path.join(inside, "pypdf", "__init__.py"),
    ]


def test_pure_mode_ignores_the_vendored_packages(pyz):
    proc = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(pyz)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=_env(RAGPROXY_PURE="1"))
    assert proc.returncode == 0, proc.stderr
    inside = os.path.join(str(pyz), "vendored")
    # pypdf adds a format, not speed: pure mode still reads PDFs.
    assert proc.stdout.split("\n")[:3] == ["None", "None", os.path.join(inside, "pypdf", "__init__.py")]
