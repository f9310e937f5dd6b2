"""dkvstream storage.

* ``dkvstream.storage.objectstore``: the object-store interface (the only gateway to bytes at rest),
  ``open_object_store(uri)`` and the local-directory implementation.
* ``dkvstream.storage.dkv``: DKV, the LSM key-value store for operator state (``DKV``, ``DKVOptions``).
* ``dkvstream.storage.errors``: every exception the package raises.

On-bucket formats: see ``docs/rfc/0001-dkv-on-bucket-formats.md`` and the module docstrings.
"""
