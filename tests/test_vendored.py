"""vendored/ must hold exactly the unmodified releases that vendored/vendor.txt pins.

The checker is driven the way a maintainer runs it (its check functions, its
command line); the tampering tests work on a copy of vendored/ so the real one
is never touched.
"""
import glob
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENDORED = os.path.join(ROOT, "vendored")
TOOL = os.path.join(ROOT, "tools", "check_vendored.py")


def _pyenv_python(minor):
    found = sorted(glob.glob("/root/.pyenv/versions/%s.*/bin/python3" % minor),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("/")[4])])
    return found[-1] if found else minor


# The oldest and newest Pythons ragproxy supports, where this machine has them.
OTHER_PYTHONS = [_pyenv_python("3.9"), _pyenv_python("3.13")]


def _load_tool():
    spec = importlib.util.spec_from_file_location("check_vendored", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cv = _load_tool()


@pytest.fixture
def vendored_copy(tmp_path):
    dst = tmp_path / "vendored"
    shutil.copytree(VENDORED, str(dst), ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_vendored_matches_vendor_txt():
    assert cv.check() == []


@pytest.mark.parametrize("python", OTHER_PYTHONS)
def test_vendored_imports_under_oldest_and_newest_python(python):
    if not os.path.exists(python):
        pytest.skip("Python %s is not installed here" % python)
    assert cv.check(python=python) == []


def test_pins_cover_the_accelerators_ragproxy_probes():
    pins = dict(cv.read_pins(os.path.join(VENDORED, "vendor.txt")))
    assert {"PyYAML", "urllib3", "pypdf"} <= set(pins)
    for name, version in pins.items():
        assert version[0].isdigit(), (name, version)


def test_command_line_reports_success():
    proc = subprocess.run([sys.executable, TOOL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches vendor.txt" in proc.stdout


def test_a_wrong_pin_is_reported(vendored_copy):
    pins = vendored_copy / "vendor.txt"
    pins.write_text(pins.read_text().replace("urllib3==", "urllib3==0.0.1+"))
    problems = cv.check(str(vendored_copy))
    assert len(problems) == 1
    assert "urllib3" in problems[0] and "__version__" in problems[0]


def test_a_missing_licence_is_reported(vendored_copy):
    (vendored_copy / "LICENSE.pypdf").unlink()
    assert cv.check(str(vendored_copy)) == ["pypdf: LICENSE.pypdf is missing"]


def test_unpinned_and_compiled_files_are_reported(vendored_copy):
    (vendored_copy / "six.py").write_text("__version__ = '1.0'\n")
    (vendored_copy / "yaml" / "_yaml.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    problems = cv.check(str(vendored_copy))
    assert any("six.py" in p and "not pinned" in p for p in problems), problems
    assert any("_yaml.cpython-311" in p and "compiled" in p for p in problems), problems


def test_pycache_left_by_running_from_a_checkout_is_tolerated(vendored_copy):
    cache = vendored_copy / "yaml" / "__pycache__"
    cache.mkdir()
    (cache / "reader.cpython-311.pyc").write_bytes(b"cache")
    assert cv.check(str(vendored_copy)) == []


def test_a_package_that_fails_to_import_is_reported(vendored_copy):
    shutil.rmtree(str(vendored_copy / "urllib3" / "util"))
    problems = cv.check(str(vendored_copy))
    assert len(problems) == 1 and "import urllib3 failed" in problems[0], problems


def test_malformed_pin_names_its_line(vendored_copy):
    (vendored_copy / "vendor.txt").write_text("# pins\nPyYAML>=6\n")
    with pytest.raises(ValueError, match=r"vendor\.txt:2: expected 'name==version'"):
        cv.check(str(vendored_copy))


# --- byte-for-byte comparison with release archives ---------------------------
# Real archives would need the network, so build stand-ins shaped like the real
# ones (PyYAML: an sdist with C sources in a top-level yaml/ and the pure
# package in lib/yaml; the others: wheels with .dist-info/licenses/).

def _files_under(vendored, mod):
    single = os.path.join(vendored, mod + ".py")
    if os.path.isfile(single):
        yield mod + ".py", single
        return
    for dirpath, dirnames, filenames in os.walk(os.path.join(vendored, mod)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            full = os.path.join(dirpath, f)
            yield os.path.relpath(full, vendored).replace(os.sep, "/"), full


def _fake_releases(vendored, out_dir):
    for dist, version in cv.read_pins(os.path.join(vendored, "vendor.txt")):
        mod = cv.import_name(dist)
        licence = open(os.path.join(vendored, "LICENSE." + dist), "rb").read()
        if dist == "PyYAML":
            top = "pyyaml-%s/" % version
            with tarfile.open(os.path.join(out_dir, "pyyaml-%s.tar.gz" % version), "w:gz") as tf:
                def add(name, data):
                    info = tarfile.TarInfo(top + name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                add("LICENSE", licence)
                add("yaml/_yaml.pyx", b"# Cython source, not part of the pure package\n")
                for rel, full in _files_under(vendored, mod):
                    add("lib/" + rel, open(full, "rb").read())
        else:
            base = "%s-%s" % (cv.normalise(dist), version)
            with zipfile.ZipFile(os.path.join(out_dir, base + "-py3-none-any.whl"), "w") as zf:
                zf.writestr(base + ".dist-info/licenses/LICENSE", licence)
                for rel, full in _files_under(vendored, mod):
                    zf.write(full, rel)


def test_against_matching_releases_finds_nothing(vendored_copy, tmp_path):
    releases = tmp_path / "releases"
    releases.mkdir()
    _fake_releases(VENDORED, str(releases))
    assert cv.compare_upstream(str(releases), str(vendored_copy)) == []


def test_against_reports_edited_added_and_missing_files(vendored_copy, tmp_path):
    releases = tmp_path / "releases"
    releases.mkdir()
    _fake_releases(VENDORED, str(releases))
    reader = vendored_copy / "yaml" / "reader.py"
    reader.write_bytes(reader.read_bytes() + b"# local patch\n")
    (vendored_copy / "pypdf" / "local_helper.py").write_text("x = 1\n")
    (vendored_copy / "urllib3" / "fields.py").unlink()
    (vendored_copy / "LICENSE.typing_extensions").write_text("not the licence\n")
    problems = cv.compare_upstream(str(releases), str(vendored_copy))
    assert sorted(problems) == sorted([
        "PyYAML: vendored/yaml/reader.py differs from upstream",
        "pypdf: vendored/pypdf/local_helper.py is not in " + _archive(releases, "pypdf-"),
        "urllib3: vendored/urllib3/fields.py is missing",
        "typing_extensions: LICENSE.typing_extensions matches no licence file in "
        + _archive(releases, "typing_extensions-"),
    ])


def _archive(releases, prefix):
    (name,) = [f for f in os.listdir(str(releases)) if f.startswith(prefix)]
    return name


def test_against_reports_a_missing_release(vendored_copy, tmp_path):
    releases = tmp_path / "releases"
    releases.mkdir()
    _fake_releases(VENDORED, str(releases))
    for name in os.listdir(str(releases)):
        if name.startswith("urllib3-"):
            os.unlink(str(releases / name))
    problems = cv.compare_upstream(str(releases), str(vendored_copy))
    assert len(problems) == 1 and problems[0].startswith("urllib3==") and "no wheel or sdist" in problems[0]
