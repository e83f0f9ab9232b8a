"""The package's layout rules, checked by tools rather than by memory.

- setup.cfg's import-linter contracts hold (layers; optional packages only
  through deps), and a deliberate back-edge breaks them;
- no module imports another module's ``_private`` names;
- every module imports only the standard library at module level, opens with
  a docstring, and says in it ("May import: ...") exactly which sibling
  modules it may import;
- optional dependencies are read as ``deps.X`` attributes, never copied;
- ``import ragproxy`` stays cheap and every public name resolves;
- a command loads only the modules it uses.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import ragproxy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "_ragproxy")
MODULES = sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py") and f != "__init__.py")
OPTIONAL = ("numpy", "yaml", "urllib3", "tiktoken", "pypdf")
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def source(module):
    with open(os.path.join(PACKAGE, module + ".py"), encoding="utf-8") as f:
        return f.read()


def lint_imports(cwd):
    """lint-imports with setup.cfg in ``cwd`` (import-linter is in requirements-test.txt: never skipped)."""
    return subprocess.run([sys.executable, "-c", LINT, "--config", "setup.cfg", "--no-cache"], cwd=str(cwd),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)


def sibling_imports(tree):
    """``{module: [(line, names)]}`` for every ``from . import`` / ``from .x import`` in a module."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.setdefault(node.module.split(".")[0], []).append((node.lineno, [a.name for a in node.names]))
            else:
                for alias in node.names:
                    if alias.name != "__version__":
                        found.setdefault(alias.name, []).append((node.lineno, [alias.name]))
    return found


def test_the_import_contracts_are_kept():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout
    assert re.search(r"Contracts: 2 kept, 0 broken", proc.stdout), proc.stdout


@pytest.mark.parametrize("change, broken", [
    # a low module reaching up: the back-edge the layers exist to stop
    (("npy.py", "\nfrom . import cli  # noqa\n"), "_ragproxy.npy -> _ragproxy.cli"),
    # two modules of one layer that must stay independent
    (("proxy.py", "\nfrom . import admin  # noqa\n"), "_ragproxy.proxy -> _ragproxy.admin"),
    # an optional package imported by name instead of through deps
    (("text.py", "\nimport numpy  # noqa\n"), "_ragproxy.text -> numpy"),
    # a new module nobody placed in a layer
    (("extra.py", '"""Nowhere yet."""\n'), "_ragproxy.extra"),
])
def test_a_deliberate_violation_breaks_the_build(tmp_path, change, broken):
    shutil.copytree(PACKAGE, str(tmp_path / "_ragproxy"), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "setup.cfg"), str(tmp_path / "setup.cfg"))
    name, text = change
    with open(str(tmp_path / "_ragproxy" / name), "a", encoding="utf-8") as f:
        f.write(text)
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert broken in proc.stdout


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_another_modules_private_names(module):
    tree = ast.parse(source(module))
    imported = sibling_imports(tree)
    for other, uses in imported.items():
        for line, names in uses:
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            assert not private, f"{module}.py:{line} imports {other}'s private {private}"
    siblings = {alias for uses in imported.values() for _, names in uses for alias in names} & set(MODULES)
    for node in ast.walk(tree):   # deps._probe and the like
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in siblings:
            assert not node.attr.startswith("_"), f"{module}.py:{node.lineno} reads {node.value.id}.{node.attr}"


@pytest.mark.parametrize("module", MODULES + ["__init__"])
def test_module_level_imports_are_the_standard_library(module):
    stdlib = getattr(sys, "stdlib_module_names", None)
    if stdlib is None:
        pytest.skip("sys.stdlib_module_names is Python 3.10+")
    tree = ast.parse(source(module))
    for node in tree.body:   # module level; an import inside a function is judged by the contracts
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] in stdlib, f"{module}.py:{node.lineno} imports {name} at module level"


def test_importing_every_module_imports_no_optional_package():
    # Probes are lazy: a module that read deps.np at import time would import numpy here.
    code = ("import importlib, sys; sys.path.insert(0, %r)\n"
            "for m in %r: importlib.import_module('_ragproxy.' + m)\n"
            "print(sorted(m for m in %r if m in sys.modules))" % (ROOT, MODULES, OPTIONAL))
    env = {k: v for k, v in os.environ.items() if k != "RAGPROXY_PURE"}
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True,
                         env=env, check=True).stdout
    assert out.strip() == "[]"


def test_a_health_check_imports_no_optional_package():
    # /health reports FEATURES: what the probes would find, or found where they ran.
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import ragproxy\n"
            "app = ragproxy.App(ragproxy.Config.from_text('api_key_auth: false'))\n"
            "before = set(sys.modules)\n"
            "body = app.handle(ragproxy.Request('GET', '/health')).body\n"
            "print(sorted(m for m in %r if m in set(sys.modules) - before), body.decode())" % (ROOT, OPTIONAL))
    env = {k: v for k, v in os.environ.items() if k != "RAGPROXY_PURE"}
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True,
                         env=env, check=True).stdout
    imported, body = out.split(" ", 1)
    assert imported == "[]"
    features = json.loads(body)["features"]
    numpy_installed = subprocess.run([sys.executable, "-c", "import numpy; print(numpy.__version__)"],
                                     stdout=subprocess.PIPE, universal_newlines=True)
    if numpy_installed.returncode == 0:
        assert features["numpy"] == numpy_installed.stdout.strip()


@pytest.mark.parametrize("module", MODULES)
def test_every_module_says_what_it_owns_and_what_it_may_import(module):
    tree = ast.parse(source(module))
    doc = ast.get_docstring(tree)
    assert doc, f"{module}.py has no docstring"
    first = doc.split("\n\n", 1)[0]
    assert len(first) > 20 and "\n" not in first.strip(), f"{module}.py: the first line says what it owns"
    allowed = re.search(r"^May import: (.+)\Z", doc, re.M | re.S)
    assert allowed, f"{module}.py: its docstring ends with 'May import: ...'"
    said = " ".join(allowed.group(1).split()).rstrip(".")
    imported = set(sibling_imports(tree))
    if said.startswith("every other module"):
        return
    if said.startswith("nothing"):
        assert imported == set(), f"{module}.py imports {sorted(imported)}"
        return
    listed = {name.strip() for name in said.split(",")}
    assert listed <= set(MODULES), f"{module}.py lists unknown modules {sorted(listed - set(MODULES))}"
    assert imported == listed, f"{module}.py: May import says {sorted(listed)}, it imports {sorted(imported)}"


@pytest.mark.parametrize("module", MODULES)
def test_optional_packages_are_read_from_deps_never_copied(module):
    tree = ast.parse(source(module))
    attributes = {"np", "yaml", "urllib3", "tiktoken", "pypdf", "FEATURES"}
    for line, names in sibling_imports(tree).get("deps", []):
        assert set(names) == {"deps"}, f"{module}.py:{line} copies {names} out of deps"
    for node in tree.body:   # `np = deps.np` at module level would freeze the value at import
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and getattr(sub.value, "id", None) == "deps":
                    assert sub.attr not in attributes, f"{module}.py:{node.lineno} reads deps.{sub.attr} at import"


def test_import_ragproxy_loads_no_implementation_module():
    code = ("import sys; sys.path.insert(0, %r); import ragproxy; "
            "print(sorted(m for m in sys.modules if m.startswith('_ragproxy')))" % ROOT)
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True,
                         check=True).stdout
    assert out.strip() == "['_ragproxy']"


def test_every_public_name_resolves_to_the_module_that_defines_it():
    for name in ragproxy.__all__:
        value = getattr(ragproxy, name)
        if name != "__version__" and hasattr(value, "__module__") and callable(value):
            assert value.__module__.startswith("_ragproxy."), name
    assert set(dir(ragproxy)) >= set(ragproxy.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        ragproxy.nonesuch


def _modules_after(argv, tmp_path, env_extra=None):
    """The _ragproxy modules and optional packages a command imported, run as ``python ragproxy.py``."""
    code = ("import runpy, sys\n"
            "sys.path.insert(0, %r)\n"   # as `python ragproxy.py` puts the script's directory first
            "sys.argv = [%r] + %r\n"
            "try:\n    runpy.run_path(%r, run_name='__main__')\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('_ragproxy.') or m in %r)))"
            % (ROOT, os.path.join(ROOT, "ragproxy.py"), list(argv), os.path.join(ROOT, "ragproxy.py"), OPTIONAL))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPROXY_")}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.strip().splitlines()[-1].split())


def test_version_loads_the_command_line_and_deps_only(tmp_path):
    assert _modules_after(["--version"], tmp_path) == {"_ragproxy.cli", "_ragproxy.deps"}


def test_a_lexical_search_loads_neither_the_server_nor_uploads_nor_numpy(tmp_path):
    (tmp_path / "data" / "config").mkdir(parents=True)   # search creates no data directory
    ragproxy.write_default_config(str(tmp_path / "data" / "config" / "config.yaml"))
    loaded = _modules_after(["search", "docs", "retry policy", "--data-dir", str(tmp_path / "data")], tmp_path)
    assert {"_ragproxy.kb", "_ragproxy.store", "_ragproxy.text", "_ragproxy.bm25", "_ragproxy.config"} <= loaded
    unused = {"_ragproxy.admin", "_ragproxy.uploads", "_ragproxy.proxy", "_ragproxy.server", "_ragproxy.reqlog",
              "_ragproxy.chunking", "_ragproxy.documents", "numpy", "pypdf"}
    assert not loaded & unused, sorted(loaded & unused)
