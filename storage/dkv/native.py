"""DKV's optional compiled read-path loops (``_native.c``), or ``None``.

``setup.py`` builds ``dkvstream.storage.dkv._native`` when a C compiler is present (it is optional:
the install never fails for want of one). Callers pick the compiled function when
``NATIVE`` is not None and the pure-Python reference otherwise; both give identical
results, which ``tests/storage/dkv/test_native.py`` checks on random and corrupted inputs.
``DKVSTREAM_DKV_NATIVE=0`` in the environment forces the pure-Python paths (to compare
or to rule the C code out); it is read once, at import.
"""
from __future__ import annotations

import os
from types import ModuleType

DISABLED = os.environ.get("DKVSTREAM_DKV_NATIVE", "1") == "0"
_loaded: ModuleType | None = None
if not DISABLED:
    try:
        from dkvstream.storage.dkv import _native as _loaded
    except ImportError:  # built without a C compiler: the pure-Python paths are used
        _loaded = None

NATIVE: ModuleType | None = _loaded
