"""A knowledge base's documents folder and its upload manifest.

DATA_DIR/documents/<kb>/ holds what was dropped there or uploaded from the
panel.  Uploads are stored under random names; manifest.json (UPLOAD_MANIFEST)
maps each stored name to the name the operator uploaded.  ``uploads`` writes
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


def read_manifest(documents_dir):
    """The upload manifest's ``files`` dict, stored name -> {name, size, sha256, uploaded_at}; {} if none."""
    try:
        with open(os.path.join(documents_dir, UPLOAD_MANIFEST), "rb") as f:
            files = json.loads(f.read().decode("utf-8")).get("files")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as e:
        log.warning("ignoring unreadable upload manifest in %s: %s", documents_dir, e)
        return {}
    return files if isinstance(files, dict) else {}


def write_manifest(documents_dir, files):
    """Replace the upload manifest's ``files`` (atomically: a crash keeps the old manifest)."""
    data = json.dumps({"files": files}, ensure_ascii=False, indent=1, sort_keys=True)
    atomic_write(os.path.join(documents_dir, UPLOAD_MANIFEST), data.encode("utf-8"))
