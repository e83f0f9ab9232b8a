"""tools/pyz_main.py, the .pyz's __main__: extract once per build, compile once, run from the copy.

Each test builds nothing itself: the archive (conftest's ``pyz``) comes from
the real build tool, and is run as a user runs it, with the cache directory given by
RAGPROXY_CACHE_DIR, XDG_CACHE_HOME or HOME as the test needs.
"""
import glob
import os
import re
import stat
import subprocess
import sys
import zipfile

import pytest

import ragproxy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(pyz, *args, python=sys.executable, **env_changes):
    """Run the archive with the environment's cache settings replaced by ``env_changes``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAGPROXY_CACHE_DIR", "XDG_CACHE_HOME", "RAGPROXY_PURE", "PYTHONPYCACHEPREFIX")}
    env.update(env_changes)
    return subprocess.run([python, pyz] + list(args or ["--version"]), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env, timeout=120)


def data_dir(tmp_path):
    """A data directory with a default config: search and kb list create none."""
    (tmp_path / "data" / "config").mkdir(parents=True)
    ragproxy.write_default_config(str(tmp_path / "data" / "config" / "config.yaml"))
    return str(tmp_path / "data")


def loaded_from(proc):
    """Where --version says the code came from."""
    assert proc.returncode == 0, proc.stderr
    return re.search(r"\) from (.+)$", proc.stdout.strip()).group(1)


def copies(cache):
    return sorted(glob.glob(os.path.join(str(cache), "pyz-*")))


def test_the_first_start_extracts_and_compiles_and_later_starts_reuse_that(pyz, tmp_path):
    cache = tmp_path / "cache"
    first = loaded_from(run(pyz, RAGPROXY_CACHE_DIR=str(cache)))
    (copy,) = copies(cache)
    assert first == copy and os.path.basename(copy).startswith("pyz-")
    assert stat.S_IMODE(os.stat(str(cache)).st_mode) == 0o700
    with zipfile.ZipFile(pyz) as zf:
        members = sorted(n for n in zf.namelist() if not n.endswith("/") and n != "__main__.py")
    for name in members:
        assert os.path.isfile(os.path.join(copy, name)), name
    tag = sys.implementation.cache_tag
    compiled = glob.glob(os.path.join(copy, "_ragproxy", "__pycache__", "*.%s.pyc" % tag))
    assert len(compiled) == len(glob.glob(os.path.join(copy, "_ragproxy", "*.py")))
    # Bytecode was written although the environment (CI's) may forbid it: the copy is ours.
    assert os.path.isfile(os.path.join(copy, "__pycache__", "ragproxy.%s.pyc" % tag))
    marker = os.stat(os.path.join(copy, "_ragproxy", "cli.py"))
    assert loaded_from(run(pyz, RAGPROXY_CACHE_DIR=str(cache))) == copy
    again = os.stat(os.path.join(copy, "_ragproxy", "cli.py"))
    assert (again.st_ino, again.st_mtime_ns) == (marker.st_ino, marker.st_mtime_ns)
    assert copies(cache) == [copy] and sorted(os.listdir(str(cache))) == [os.path.basename(copy)]


def test_the_cache_defaults_to_xdg_then_home(pyz, tmp_path):
    assert loaded_from(run(pyz, XDG_CACHE_HOME=str(tmp_path / "xdg"))).startswith(str(tmp_path / "xdg" / "ragproxy"))
    home = tmp_path / "home"
    home.mkdir()
    assert loaded_from(run(pyz, HOME=str(home))).startswith(str(home / ".cache" / "ragproxy" / "pyz-"))


def test_without_a_usable_cache_it_runs_from_the_archive(pyz, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), 0o777)   # another user could plant code there
    for env in ({"HOME": ""},                                   # no home at all
                {"HOME": str(tmp_path / "deleted")},
                {"RAGPROXY_CACHE_DIR": str(a_file / "cache")},   # cannot be created (read-only, say)
                {"RAGPROXY_CACHE_DIR": "relative/cache"},
                {"RAGPROXY_CACHE_DIR": str(shared)}):
        proc = run(pyz, **env)
        assert loaded_from(proc) == pyz, env
        assert proc.stderr == ""
    assert os.listdir(str(shared)) == []


def test_a_server_starts_from_the_archive_when_there_is_no_cache(pyz, tmp_path):
    proc = run(pyz, "search", "docs", "anything", "--data-dir", data_dir(tmp_path), HOME="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no match\n"


def test_a_copy_that_lost_files_is_replaced(pyz, tmp_path):
    cache = tmp_path / "cache"
    copy = loaded_from(run(pyz, RAGPROXY_CACHE_DIR=str(cache)))
    os.unlink(os.path.join(copy, "_ragproxy", "kb.py"))
    proc = run(pyz, "kb", "list", "--data-dir", data_dir(tmp_path), RAGPROXY_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(os.path.join(copy, "_ragproxy", "kb.py")) and copies(cache) == [copy]
    assert sorted(os.listdir(str(cache))) == [os.path.basename(copy)]   # nothing set aside is left behind


def test_processes_starting_together_share_one_copy(pyz, tmp_path):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "RAGPROXY_PURE"}
    env["RAGPROXY_CACHE_DIR"] = str(cache)
    procs = [subprocess.Popen([sys.executable, pyz, "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, env=env) for _ in range(6)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, outputs
    (copy,) = copies(cache)
    assert {re.search(r"\) from (.+)$", out.strip()).group(1) for out, _ in outputs} == {copy}
    assert sorted(os.listdir(str(cache))) == [os.path.basename(copy)]


@pytest.mark.parametrize("minor", ["3.9", "3.13"])
def test_another_python_compiles_its_own_bytecode_into_the_same_copy(pyz, tmp_path, minor):
    found = sorted(glob.glob("/root/.pyenv/versions/%s.*/bin/python3" % minor))
    if not found:
        pytest.skip("Python %s is not installed here" % minor)
    cache = tmp_path / "cache"
    copy = loaded_from(run(pyz, RAGPROXY_CACHE_DIR=str(cache)))
    other = subprocess.run([found[-1], "-c", "import sys; print(sys.implementation.cache_tag)"],
                           stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
    assert loaded_from(run(pyz, python=found[-1], RAGPROXY_CACHE_DIR=str(cache))) == copy
    for tag in (sys.implementation.cache_tag, other):
        assert os.path.isfile(os.path.join(copy, "_ragproxy", "__pycache__", "cli.%s.pyc" % tag)), tag


def test_tracebacks_name_the_copy_not_the_staging_directory(pyz, tmp_path):
    cache = tmp_path / "cache"
    copy = loaded_from(run(pyz, RAGPROXY_CACHE_DIR=str(cache)))
    probe = ("import sys; sys.path.insert(0, %r); import _ragproxy.cli as cli; "
             "print(cli.main.__code__.co_filename)" % copy)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", probe], stdout=subprocess.PIPE, universal_newlines=True,
                         env=env, check=True).stdout.strip()
    assert out == os.path.join(copy, "_ragproxy", "cli.py")
