"""Arrow readers' input from bytes held by Python, in memory Arrow owns.

Every reader here decodes objects it fetched as ``bytes`` (Parquet sink files, landed
files, Kafka records, Delta staging files). Handing those bytes to pyarrow as a Python
file (``io.BytesIO``) or a ``pa.py_buffer`` makes every buffer Arrow reads from them a
*Python-owned* buffer, and releasing such a buffer takes the GIL. pyarrow's Parquet and
dataset readers (``pq.read_table``: the read-range cache of ``pre_buffer``, readahead)
finish some work on Arrow's CPU and I/O thread pools *after* the call has returned, so
the last reference to such a buffer can be dropped by an Arrow worker thread. When that
happens while the interpreter is exiting, ``PyGILState_Ensure`` ends the worker thread
(``pthread_exit``) inside a ``noexcept`` C++ destructor, and the process aborts after
the script has done its work: ``terminate called without an active exception``, exit
status 134. pyarrow 26.0.1 does this, as did 10 to 15 in apache/arrow issues 34314,
36389 and 39862 (open); it hits a script that reads output and exits at once, as tests do.

A copy into Arrow's memory pool (one ``memcpy``, small next to the GET and the decode)
leaves nothing of Python's in Arrow's hands: a worker releasing the last reference only
frees pool memory, which needs no interpreter.
"""
from __future__ import annotations

import pyarrow as pa


def arrow_input(data: bytes | bytearray | memoryview) -> pa.BufferReader:
    """A random-access Arrow file over a copy of ``data`` in Arrow's default memory
    pool, for ``pq.read_table``, ``pq.ParquetFile``, ``pyarrow.csv.read_csv`` and
    ``pyarrow.json.read_json``.

    Args:
        data: the encoded object (any bytes-like object); not referenced after the call.

    Returns:
        a ``pa.BufferReader`` whose buffers (and every slice a reader takes of them) are
        owned by Arrow, so Arrow's threads never need the GIL to release them.
    """
    out = pa.BufferOutputStream()
    out.write(data)
    return pa.BufferReader(out.getvalue())
