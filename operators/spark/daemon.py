"""Spark's Python daemon with the task modules imported once, before it forks workers.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``); the
daemon forks a Python worker for each concurrent task, and each worker imports what its
tasks need: ``pyspark.worker``, then, while unpickling the task function,
``dkvstream.operators.spark.stage`` (pyarrow, numpy, DKV), then on first use pandas (pyarrow's
``pa.array`` from Python lists imports it) and ``pyarrow.acero``/``dataset``
(``Table.group_by``). That is ~0.6 s of CPU per worker on a quiet core, 2-5 s under
load, paid in the first epoch of every executor's every worker. ``dkvstream.operators.spark.session``
points ``spark.python.daemon.module`` here, so the daemon imports them once and every
worker is forked with them loaded (copy-on-write).

Why pyspark's own daemon does not: "both pandas and pyarrow start some threads when they
are imported", and a fork taken while another thread holds a lock (malloc's, the import
lock) can deadlock the child. Measured with pyarrow 19-22 and numpy 2 on Linux, the only
threads these imports start are OpenBLAS's pool (none when ``OPENBLAS_NUM_THREADS=1``)
and jemalloc's background purging thread (none with ``background_thread:false``; Arrow
uses mimalloc or jemalloc for its pools either way). ``dkvstream.operators.spark.session`` sets both in
the executors' environment (``spark.executorEnv.*``: the daemon's environment, which
must hold them before ``python -m dkvstream.operators.spark.daemon`` imports the ``operators``
package), and this module checks that the process is single-threaded after its imports,
so the fork copies a process with no other thread. If any preload (``DKVSTREAM_SPARK_PRELOAD`` adds
comma-separated modules, e.g. a job's operator module) did start a thread, it replaces
itself with pyspark's plain daemon (``exec``, same stdin and stdout to the JVM), which
imports after the fork as before, and says so on stderr.

After the imports it calls ``gc.freeze()`` (what the ``gc`` docs advise before a fork):
the ~78,000 objects of the imported libraries move to the permanent generation, so the
workers' collections skip them. PySpark's daemon runs a full ``gc.collect()`` in a
reused worker after every task; over those objects that cost 15-85 ms per task and
epoch on this machine.

Before the imports it takes Spark's ``pyspark.zip`` and ``py4j-<version>-src.zip`` off
``sys.path`` when they are copies of the installed packages (``without_shipped_zips``):
Spark puts them first on its workers' ``PYTHONPATH``, and from a zip every start compiles
pyspark from source (``zipimport`` keeps no bytecode). That was 1.1-1.3 s of the daemon's
2.0 s of imports, on the session's first epoch.
"""
from __future__ import annotations

import gc
import importlib
import os
import re
import sys

# Imported before the fork: what a dkvstream task needs, in import order.
PRELOAD = ("pyspark.worker", "numpy", "pyarrow", "pyarrow.compute", "pyarrow.acero", "pyarrow.dataset",
           "pandas", "dkvstream.operators.spark.stage")

PRELOAD_ENV = "DKVSTREAM_SPARK_PRELOAD"


def preload_modules(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """``PRELOAD`` plus the modules named in ``DKVSTREAM_SPARK_PRELOAD`` (comma-separated)."""
    environ = os.environ if environ is None else environ
    extra = tuple(m.strip() for m in environ.get(PRELOAD_ENV, "").split(",") if m.strip())
    return PRELOAD + extra


def without_shipped_zips(path: list[str]) -> list[str]:
    """``path`` (a ``sys.path``) without the ``pyspark.zip`` and ``py4j-<v>-src.zip`` that
    Spark ships to Python workers, when the rest of ``path`` installs the same files.

    With pyspark installed from PyPI, ``SPARK_HOME`` is the installed package and
    ``<site>/pyspark/python/lib/pyspark.zip`` is a copy of ``<site>/pyspark``: that zip is
    dropped when ``<site>/pyspark/__init__.py`` exists for a ``<site>`` on ``path``. A
    ``py4j-<v>-src.zip`` beside it is dropped when an installed ``py4j/version.py`` says
    ``<v>``. Any other entry stays: a cluster's own ``SPARK_HOME``, ``--py-files``, a jar.
    Why: ``zipimport`` caches no bytecode, so importing ``pyspark.worker`` from the zip
    compiles it and pyspark's SQL modules from source in every daemon (1.1-1.3 s of CPU
    on this machine against 0.15-0.2 s from the installed ``.pyc`` files).

    Args:
        path: import path entries, in order.

    Returns:
        The entries kept, in order.
    """
    dirs = [p for p in path if os.path.isdir(p)]
    installed = {os.path.realpath(os.path.join(d, "pyspark", "python", "lib"))
                 for d in dirs if os.path.isfile(os.path.join(d, "pyspark", "__init__.py"))}
    py4j_versions = set()
    for d in dirs:
        try:
            with open(os.path.join(d, "py4j", "version.py"), encoding="utf-8") as f:
                found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read())
        except OSError:
            continue
        if found:
            py4j_versions.add(found.group(1))

    def shipped_copy(entry: str) -> bool:
        if os.path.realpath(os.path.dirname(entry)) not in installed:
            return False
        name = os.path.basename(entry)
        py4j = re.fullmatch(r"py4j-(.+)-src\.zip", name)
        return name == "pyspark.zip" or (py4j is not None and py4j.group(1) in py4j_versions)

    return [p for p in path if not shipped_copy(p)]


def os_threads() -> list[str]:
    """Names of this process's OS threads (Linux ``/proc``); elsewhere, Python's threads."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        import threading

        return [t.name for t in threading.enumerate()]
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended while listing
            pass
    return names


def main() -> None:
    """Preload, check, then run pyspark's daemon loop (or exec the plain daemon)."""
    sys.path[:] = without_shipped_zips(sys.path)
    failed = []
    for name in preload_modules():
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a worker would hit the same error and report it
            failed.append(f"{name}: {e}")
    threads = os_threads()
    if len(threads) > 1:
        print(f"dkvstream.operators.spark.daemon: preloads started {len(threads) - 1} thread(s) {threads[1:]}; "
              f"forking is unsafe, running pyspark.daemon instead", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    gc.freeze()  # the imported modules live as long as the daemon and its workers
    if failed:
        print(f"dkvstream.operators.spark.daemon: preload failed ({'; '.join(failed)}); workers import on use",
              file=sys.stderr, flush=True)
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
