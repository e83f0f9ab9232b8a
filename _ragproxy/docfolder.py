"""A knowledge base's documents folder and its upload manifest.

DATA_DIR/documents/<kb>/ holds what was dropped there or uploaded from the
panel.  Uploads are stored under random names; manifest.json (UPLOAD_MANIFEST)
maps each stored name to the name the operator uploaded.  It is replaced
atomically (a crash keeps the old one or the new, never half of either).  ``uploads`` writes
it, ``kb`` reads it to cite files by their real names, ``admin`` lists it.

May import: files.
"""
from __future__ import annotations

import json
import logging
import os

from .files import atomic_write

log = logging.getLogger("ragproxy")


# In the documents folder, but not a document: the indexer skips it.
UPLOAD_MANIFEST = "manifest.json"


class ManifestError(Exception):
    """The upload manifest is there but cannot be read (only with ``read_manifest(strict=True)``)."""


def read_manifest(documents_dir, strict=False):
    """The upload manifest's ``files`` dict, stored name -> {name, size, sha256, uploaded_at}; {} if none.

    One that is there but unreadable reads as {} (logged), so the indexer goes on; with ``strict``
    it raises ManifestError instead: a writer must not replace it with a manifest that has
    forgotten every earlier upload's name.
    """
    path = os.path.join(documents_dir, UPLOAD_MANIFEST)
    try:
        with open(path, "rb") as f:
            files = json.loads(f.read().decode("utf-8")).get("files")
        if not isinstance(files, dict):
            raise ValueError("its 'files' is not a mapping")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as e:
        if strict:
            raise ManifestError(f"{path} cannot be read: {e}") from None
        log.warning("ignoring unreadable upload manifest in %s: %s", documents_dir, e)
        return {}
    return files


def write_manifest(documents_dir, files):
    """Replace the upload manifest's ``files`` (atomically: a crash keeps the old manifest)."""
    data = json.dumps({"files": files}, ensure_ascii=False, indent=1, sort_keys=True)
    atomic_write(os.path.join(documents_dir, UPLOAD_MANIFEST), data.encode("utf-8"))
