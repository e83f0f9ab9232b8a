"""The implementation of ragproxy, one module per job; ``ragproxy`` is its public face.

Nothing here is public API: import names from ``ragproxy``.  The package
imports nothing at import time, so ``import ragproxy`` and every command load
only the modules they use.  README.md ("Where things are") maps the modules;
each module's docstring says what it owns and what it may import, and
setup.cfg's import-linter contracts hold the layering.
"""

__version__ = "0.1.0"
