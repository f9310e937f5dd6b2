"""A deterministic synthetic source and a two-operator chain used by tests and benchmarks.

``SyntheticSource(events, keys, partitions, seed)``: event i of partition p has key
``k<n>`` with n uniform in [0, keys) (or Zipf-distributed with ``zipf=s``), timestamp
``i * step_ms`` (+ p), and value ``{"amount": int}``. Same arguments, same events, on
every machine.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dkvstream.operators.api.codecs import IntCodec
from dkvstream.operators.api.columns import KEY_COLUMN, TIMESTAMP_COLUMN
from dkvstream.operators.api.operator import KeyedEvent, Operator, Subject
from dkvstream.operators.api.state import MapSpec
from dkvstream.operators.io.sources import Source

if TYPE_CHECKING:
    import pandas as pd


class SyntheticSource(Source):
    """Deterministic random events (see module docstring).

    Args:
        events: events per partition.
        keys: number of distinct keys.
        partitions: number of partitions.
        step_ms: event-time step between consecutive events of a partition (ms).
        seed: random seed.
    """

    name = "synthetic"

    def __init__(self, events: int, keys: int, partitions: int = 2, step_ms: int = 1000, seed: int = 7,
                 zipf: float | None = None) -> None:
        if zipf is not None and zipf <= 1:
            raise ValueError(f"zipf exponent must be > 1, got {zipf}")
        self.events, self.keys, self.n_partitions, self.step_ms, self.seed = events, keys, partitions, step_ms, seed
        self.zipf = zipf
        self._cache: dict[str, pa.Table] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": {}}  # generated data never travels to Spark

    def partitions(self) -> list[str]:
        return [f"p{i}" for i in range(self.n_partitions)]

    def end_offsets(self) -> dict[str, int]:
        return {p: self.events for p in self.partitions()}

    @property
    def value_schema(self) -> pa.Schema:
        return pa.schema([pa.field("amount", pa.int64())])

    def full_partition(self, partition: str) -> pa.Table:
        """All events of ``partition`` (the oracle's input), generated once per source.

        Keys: uniform over ``k0 .. k<keys-1>``, or with ``zipf=s`` key rank r >= 1 drawn
        with probability proportional to r^-s (numpy's ``zipf``), folded into the key space
        as ``k<(r - 1) mod keys>``.
        """
        cached = self._cache.get(partition)
        if cached is None:
            # Read tasks get the source pickled without its cache (``__getstate__``): a
            # worker process generates a partition once, not once per task.
            cached = self._cache[partition] = _generated(self.events, self.keys, self.step_ms, self.seed,
                                                         self.zipf, self.partitions().index(partition))
        return cached

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        if not 0 <= start <= end <= self.events:
            raise IndexError(f"{self.name}/{partition}: offsets [{start}, {end}) outside [0, {self.events}]")
        return self.full_partition(partition).slice(start, end - start)


@functools.lru_cache(maxsize=8)
def _generated(events: int, keys: int, step_ms: int, seed: int, zipf: float | None, p: int) -> pa.Table:
    """Partition ``p`` of ``SyntheticSource(events, keys, step_ms=step_ms, seed=seed, zipf=zipf)``."""
    rng = np.random.default_rng([seed, p])
    if zipf is None:
        ids = rng.integers(0, keys, events)
    else:
        ids = (rng.zipf(zipf, events) - 1) % keys
    amounts = rng.integers(1, 100, events)
    key_column = pc.binary_join_element_wise("k", pc.cast(pa.array(ids), pa.string()), "").cast(pa.binary())
    ts = np.arange(events, dtype=np.int64) * step_ms + p
    return pa.table({KEY_COLUMN: key_column, TIMESTAMP_COLUMN: ts, "amount": amounts})


WINDOW_COUNT_SCHEMA = pa.schema([pa.field("group", pa.string()), pa.field("window_start", pa.int64()),
                                 pa.field("count", pa.int64()), pa.field("amount", pa.int64())])
GROUP_SUM_SCHEMA = pa.schema([pa.field("group", pa.string()), pa.field("window_start", pa.int64()),
                              pa.field("keys", pa.int64()), pa.field("count", pa.int64()),
                              pa.field("amount", pa.int64())])


def group_of(key: bytes, groups: int = 5) -> str:
    """The group a synthetic key belongs to (``g<n mod groups>``)."""
    return f"g{int(key[1:]) % groups}"


class KeyWindowCount(Operator):
    """Per key and tumbling window: event count and amount sum; re-keyed by group."""

    name = "key_window_count"
    outputs = {"main": WINDOW_COUNT_SCHEMA}
    window_ms = 60_000
    totals = MapSpec(IntCodec(), IntCodec(), id="totals")  # window_start*2 + field -> value

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.timestamp - event.timestamp % self.window_ms
        m = self.totals.state_for(subject)
        m.set(start * 2, (m.get(start * 2) or 0) + 1)
        m.set(start * 2 + 1, (m.get(start * 2 + 1) or 0) + event.value["amount"])
        subject.set_timer(start + self.window_ms)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - self.window_ms
        m = self.totals.state_for(subject)
        group = group_of(subject.key)
        subject.emit({"group": group, "window_start": start, "count": m.get(start * 2),
                      "amount": m.get(start * 2 + 1)}, key=group.encode())
        m.delete(start * 2)
        m.delete(start * 2 + 1)


class GroupWindowSum(Operator):
    """Per group and window: sums the per-key windows of ``KeyWindowCount``."""

    name = "group_window_sum"
    outputs = {"main": GROUP_SUM_SCHEMA}
    window_ms = 60_000
    sums = MapSpec(IntCodec(), IntCodec(), id="sums")  # window_start*4 + field

    def on_event(self, subject: Subject, event: KeyedEvent) -> None:
        start = event.value["window_start"]
        m = self.sums.state_for(subject)
        for i, add in enumerate((1, event.value["count"], event.value["amount"])):
            m.set(start * 4 + i, (m.get(start * 4 + i) or 0) + add)
        subject.set_timer(start + self.window_ms)

    def on_timer_expired(self, subject: Subject, timestamp: int) -> None:
        start = timestamp - self.window_ms
        m = self.sums.state_for(subject)
        keys, count, amount = (m.get(start * 4 + i) for i in range(3))
        subject.emit({"group": subject.key.decode(), "window_start": start, "keys": keys,
                      "count": count, "amount": amount})
        for i in range(3):
            m.delete(start * 4 + i)


def window_count_oracle(events: pd.DataFrame) -> pd.DataFrame:
    """``KeyWindowCount``'s output computed by pandas, the tests' oracle.

    Args:
        events: Input events with columns ``key`` (bytes), ``timestamp`` (ms), ``amount``.

    Returns:
        Columns ``group, window_start, count, amount``, one row per key and window, sorted
        by every column, int64.
    """
    df = events.copy()
    df["window_start"] = df["timestamp"] - df["timestamp"] % KeyWindowCount.window_ms
    out = df.groupby(["key", "window_start"], as_index=False).agg(
        count=("amount", "size"), amount=("amount", "sum"))
    out["group"] = [group_of(k) for k in out["key"]]
    out = out[["group", "window_start", "count", "amount"]]
    return out.sort_values(list(out.columns)).reset_index(drop=True).astype("int64", errors="ignore")
