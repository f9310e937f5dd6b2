"""DKV: an embedded LSM key-value store whose files live in an object store.

``DKV.open(store, prefix, manifest_key, options)`` returns an instance; see ``db.py`` for
the lifecycle and the module docstrings for each on-bucket format (``wal.py``,
``sstable.py``, ``bloom.py``, ``manifest.py``, ``paths.py``).
"""

from __future__ import annotations

from dkvstream.storage.dkv.db import DKV
from dkvstream.storage.dkv.options import DKVOptions

__all__ = ["DKV", "DKVOptions"]
