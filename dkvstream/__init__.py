"""dkvstream: keyed, stateful stream operators on PySpark with state in DKV, run by Dagster.

The public API, re-exported here::

    from dkvstream import Job, Operator, BatchOperator, ValueSpec, ParquetSink, JobRunner
    from dkvstream import dkvstream_definitions  # a Dagster Definitions of your jobs

The same names as ``dkvstream.operators`` (the job API: operators, state specs, codecs,
jobs, sources and sinks, errors), plus ``dkvstream_definitions``
(``dkvstream.assets.definitions``: the Dagster assets, checks, jobs and sensors of
stream jobs). ``JobRunner``, the connectors, ``get_spark`` and ``dkvstream_definitions``
are imported on first use, so ``import dkvstream`` imports neither Spark nor Dagster.

Packages: ``dkvstream.operators`` (the job API and runtime), ``dkvstream.storage`` (DKV,
the log, object stores), ``dkvstream.assets`` (Dagster), ``dkvstream.examples`` (the
example jobs; their data needs the ``examples`` extra: ``pip install 'dkvstream[examples]'``).
"""
from __future__ import annotations

import importlib
import os

# A source checkout keeps the packages in top-level folders beside this one (operators/,
# storage/, ...; an install maps them under dkvstream/, see setup.py). Run from a checkout
# without an install (its root on sys.path: a git worktree beside another checkout's
# editable install, or a script that puts the root first), ``dkvstream.operators`` is
# then still the checkout's own ``operators/``. An installed wheel holds
# ``dkvstream/operators/`` and searches only its own folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_HERE, "operators")) and os.path.isfile(
        os.path.join(os.path.dirname(_HERE), "operators", "__init__.py")):
    __path__.append(os.path.dirname(_HERE))  # noqa: F821 (a package's __path__)

from dkvstream import operators as _operators  # noqa: E402 (after __path__ is complete)

# The light names now; the heavy ones (``_operators._LAZY``) when first named.
globals().update({name: getattr(_operators, name) for name in _operators.__all__
                  if name not in _operators._LAZY})

_LAZY = {name: module for name, module in _operators._LAZY.items()}
_LAZY["dkvstream_definitions"] = "dkvstream.assets.definitions"


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dkvstream' has no attribute {name!r}")


__all__ = [*_operators.__all__, "dkvstream_definitions"]
