"""Optional dependencies, probed here and nowhere else.

numpy, PyYAML and urllib3 make ragproxy faster when they are importable;
tiktoken makes its token counts exact; pypdf (vendored into the .pyz) lets it
read PDF files.  Each has a fallback: the standard library, an estimate, or a
PDF skipped with a reason.  ``RAGPROXY_PURE=1`` turns the three accelerators
and tiktoken off, so the fallbacks are what runs (and what CI tests).

Every other module reads them as attributes of this module, ``deps.np``,
``deps.yaml``, ``deps.urllib3``, ``deps.tiktoken``, ``deps.pypdf``: None when
absent or switched off.  Nothing copies one into its own namespace, so a
test that sets ``deps.np = None`` switches every module at once.  A probe
runs on the first read of its attribute, not at import: a command that never
touches numpy never pays for importing it.

``installed()`` says what a probe would find without importing anything,
for ``--version``, and ``FEATURES`` (for ``/health`` and the panel) is that
with what the probes that have run found instead: importing numpy alone takes
longer than starting Python, and a health check must not pay for it.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import os
import sys

#: FEATURES key -> (attribute here, module to import, distribution name, switched off by RAGPROXY_PURE)
_OPTIONAL = {
    "numpy": ("np", "numpy", "numpy", True),
    "pyyaml": ("yaml", "yaml", "PyYAML", True),
    "urllib3": ("urllib3", "urllib3", "urllib3", True),
    "tiktoken": ("tiktoken", "tiktoken", "tiktoken", True),
    "pypdf": ("pypdf", "pypdf", "pypdf", False),   # no stdlib fallback to test: PDFs are read in both modes
}
_PROBES = {attr: (module, pure_switch) for attr, module, _, pure_switch in _OPTIONAL.values()}
#: Accelerators, as opposed to pypdf, which adds a format rather than speed.
ACCELERATORS = ("numpy", "pyyaml", "urllib3", "tiktoken")


def pure_mode(environ=None):
    """Whether RAGPROXY_PURE asks for the stdlib fallbacks."""
    return (os.environ if environ is None else environ).get("RAGPROXY_PURE", "") not in ("", "0")


def _add_vendored_path():
    """Put ``vendored/`` beside the package (a checkout, the .pyz or its extracted copy) on sys.path.

    Appended, so a package the user installed wins over the vendored copy.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    vendored = os.path.join(root, "vendored")
    # Inside a zipapp the root is the .pyz file itself; os.path.isdir cannot
    # look into it, and the build always packs vendored/.
    if (os.path.isdir(vendored) or os.path.isfile(root)) and vendored not in sys.path:
        sys.path.append(vendored)


def _probe(module_name, pure_switch):
    if pure_switch and pure_mode():
        return None
    try:
        return __import__(module_name, fromlist=["_"])
    except ModuleNotFoundError:
        return None
    except Exception as exc:  # a broken install must not stop the proxy, nor go unnoticed
        import logging
        logging.getLogger("ragproxy").warning("%s is installed but does not import (%s: %s); using the fallback",
                                              module_name, type(exc).__name__, exc)
        return None


def _features():
    """``{feature: version or None, "pure": bool}``: a probe's answer where it has run, else what it would find."""
    global _found
    if _found is None:
        _found = installed()
    features = {}
    for feature, (attr, _, _, _) in _OPTIONAL.items():
        if attr in globals():   # probed: the version of what was imported, None if it failed or is off
            features[feature] = getattr(globals()[attr], "__version__", None)
        else:
            features[feature] = _found.get(feature, (None, ""))[0]
    features["pure"] = pure_mode()
    return features


_found = None   # installed(), once: what is on sys.path does not change while we run


def installed():
    """``{feature: (version, where)}`` for what the probes would find, importing nothing.

    ``where`` is "vendored" for a copy from vendored/ (its version is the pin in
    vendor.txt), else "". The version is read from the install's
    ``NAME-VERSION.dist-info`` folder; None when it cannot be told.  Switched
    off (RAGPROXY_PURE) and missing features are left out.
    """
    from importlib.util import find_spec

    found = {}
    for feature, (_, module, dist, pure_switch) in _OPTIONAL.items():
        if pure_switch and pure_mode():
            continue
        try:
            spec = find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            continue
        location = spec.submodule_search_locations
        home = os.path.dirname(location[0] if location else spec.origin)
        if os.path.basename(home) == "vendored":
            found[feature] = (_vendored_pin(home, dist), "vendored")
        else:
            found[feature] = (_dist_info_version(home, dist), "")
    return found


def _vendored_pin(vendored, dist):
    """The ``dist==VERSION`` pin of vendored/vendor.txt (read through our loader: it may sit in a zip)."""
    try:
        text = __loader__.get_data(os.path.join(vendored, "vendor.txt")).decode("utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition("==")
        if name.strip() == dist and rest:
            return rest.split()[0]
    return None


def _dist_info_version(site_dir, dist):
    """VERSION from ``site_dir``'s ``dist-VERSION.dist-info`` (names compared as PEP 503 normalises them)."""
    def normal(name):
        return name.lower().replace("-", "_").replace(".", "_")
    want = normal(dist)
    try:
        entries = os.listdir(site_dir)
    except OSError:
        return None
    for entry in entries:
        stem, dot, suffix = entry.rpartition(".")
        if dot and suffix in ("dist-info", "egg-info"):
            name, _, version = stem.partition("-")
            if normal(name) == want and version:
                return version.split("-")[0]
    return None


def probed(name):
    """The dependency behind attribute ``name`` if its probe has run already, else None; never probes.

    For code that uses an accelerator only where it pays: once it is
    imported it costs nothing more, while importing numpy alone takes longer
    than a whole one-shot lexical search.
    """
    return globals().get(name)


def __getattr__(name):
    """Probe an optional dependency on first read; the answer then stays (PEP 562)."""
    if name == "FEATURES":
        return _features()   # not kept: it follows the probes as they run
    if name in _PROBES:
        value = _probe(*_PROBES[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


_add_vendored_path()
