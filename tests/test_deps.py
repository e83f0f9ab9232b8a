"""Optional dependencies (_ragproxy.deps): what installed() reports, RAGPROXY_PURE, lazy probes, FEATURES.

Most tests run a fresh Python in a subprocess, since a probe's answer stays
for the life of the process and the suite's own process has read them all:
without RAGPROXY_PURE, with RAGPROXY_PURE=1, without site-packages (``-S``:
only the vendored copies are found), and with a fake package that breaks at
import first on sys.path.
"""
import json
import os
import subprocess
import sys

from _ragproxy import deps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENDORED = os.path.join(ROOT, "vendored")
MODULES = {"numpy": "numpy", "pyyaml": "yaml", "urllib3": "urllib3", "tiktoken": "tiktoken", "pypdf": "pypdf"}
DISTS = {"numpy": "numpy", "pyyaml": "PyYAML", "urllib3": "urllib3", "tiktoken": "tiktoken", "pypdf": "pypdf"}


def run_python(code, pure=False, args=(), path_first=None):
    """Run ``code`` in a fresh interpreter that imports from the checkout; its stdout, parsed as JSON."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAGPROXY_PURE", "PYTHONPATH")}
    if pure:
        env["RAGPROXY_PURE"] = "1"
    setup = "import sys; sys.path.insert(0, %r)\n" % ROOT
    if path_first:
        setup += "sys.path.insert(0, %r)\n" % path_first
    proc = subprocess.run([sys.executable, *args, "-c", setup + code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def vendor_pins():
    pins = {}
    with open(os.path.join(VENDORED, "vendor.txt"), encoding="utf-8") as f:
        for line in f:
            name, sep, rest = line.partition("==")
            if sep and not name.startswith("#"):
                pins[name.strip()] = rest.split()[0]
    return pins


# What installed() says, then what importing each module it names really gives.
REPORT = """
import json
from _ragproxy import deps
found = deps.installed()
imported_early = sorted(m for m in %r if m in sys.modules)
real = {}
for feature in found:
    module = __import__(%r[feature])
    real[feature] = [getattr(module, "__version__", None), module.__file__]
print(json.dumps({"found": found, "real": real, "imported_early": imported_early}))
""" % (sorted(MODULES.values()), MODULES)


def test_installed_reports_the_versions_a_real_import_finds():
    report = run_python(REPORT)
    found, real = report["found"], report["real"]
    assert report["imported_early"] == []                         # installed() imported nothing
    assert {"numpy", "pyyaml", "urllib3"} <= set(found)          # requirements-test.txt installs them
    pins = vendor_pins()
    for feature, (version, where) in found.items():
        real_version, real_file = real[feature]
        if where == "vendored":
            assert version == pins[DISTS[feature]] == real_version, feature
            assert real_file.startswith(VENDORED + os.sep), feature
        else:
            assert where == "" and version == real_version, feature
            assert not real_file.startswith(VENDORED + os.sep), feature


def test_installed_reports_vendored_copies_with_their_pin():
    report = run_python(REPORT, args=["-S"])   # no site-packages: what is found is what vendored/ holds
    pins = vendor_pins()
    assert report["found"] == {"pyyaml": [pins["PyYAML"], "vendored"], "urllib3": [pins["urllib3"], "vendored"],
                               "pypdf": [pins["pypdf"], "vendored"]}
    for feature, (real_version, real_file) in report["real"].items():
        assert real_version == pins[DISTS[feature]] and real_file.startswith(VENDORED + os.sep), feature


def test_pure_mode_switches_the_accelerators_off_but_not_pypdf():
    report = run_python("""
import json
from _ragproxy import deps
print(json.dumps({"np": deps.np is None, "yaml": deps.yaml is None, "urllib3": deps.urllib3 is None,
                  "tiktoken": deps.tiktoken is None, "pypdf": deps.pypdf is None,
                  "installed": sorted(deps.installed()), "pure": deps.FEATURES["pure"]}))
""", pure=True)
    assert report == {"np": True, "yaml": True, "urllib3": True, "tiktoken": True, "pypdf": False,
                      "installed": ["pypdf"], "pure": True}


def test_a_probe_runs_on_the_first_read_only():
    report = run_python("""
import json
from _ragproxy import deps
before = "numpy" in sys.modules
np = deps.np
after = "numpy" in sys.modules
deps._probe = None   # a second read that probed again would fail
again = deps.np is np
print(json.dumps({"before": before, "after": after, "same": np is sys.modules["numpy"], "again": again,
                  "yaml_untouched": "yaml" not in sys.modules}))
""")
    assert report == {"before": False, "after": True, "same": True, "again": True, "yaml_untouched": True}


def test_features_names_every_dependency_and_pure_mode():
    assert set(deps.FEATURES) == {"numpy", "pyyaml", "urllib3", "tiktoken", "pypdf", "pure"}
    assert deps.FEATURES["pure"] is deps.pure_mode()
    assert deps.FEATURES["numpy"] == (deps.np.__version__ if deps.np is not None else None)
    assert deps.FEATURES["pypdf"] == deps.pypdf.__version__


def test_a_module_that_fails_to_import_is_none_and_logged(tmp_path):
    package = tmp_path / "tiktoken"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('half-installed wheel')\n")
    report = run_python("""
import json, logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.name, record.levelname, record.getMessage()])
logging.getLogger("ragproxy").addHandler(Keep())
from _ragproxy import deps
print(json.dumps({"none": deps.tiktoken is None, "records": records}))
""", path_first=str(tmp_path))
    assert report["none"] is True
    assert report["records"] == [["ragproxy", "WARNING", "tiktoken is installed but does not import "
                                  "(RuntimeError: half-installed wheel); using the fallback"]]
