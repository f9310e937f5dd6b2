"""Console tools for the log, after Kafka's ``kafka-topics --create``,
``kafka-console-producer``, ``kafka-console-consumer`` and ``kafka-consumer-groups``.

Usage::

    python -m dkvstream.storage.log.console create-topic --topic T [--partitions N] [--compact]
    python -m dkvstream.storage.log.console produce --topic T [--property parse.key=true] < lines
    python -m dkvstream.storage.log.console consume --topic T [--from-beginning] [--group G]
        [--partition P [--offset earliest|latest|N]] [--max-messages N] [--follow]
        [--property print.key=true ...] [--json [--hex]]
    python -m dkvstream.storage.log.console groups --list
    python -m dkvstream.storage.log.console groups --describe (--group G | --all-groups)
    python -m dkvstream.storage.log.console groups --reset-offsets --group G --topic T
        (--to-earliest | --to-latest | --to-offset N) [--execute]

Every command takes ``--store`` (the object-store root, default ``.dkvstream``) and
``--prefix`` (the log's prefix in it, default ``log``).

``produce`` sends each line of standard input as one record, its bytes unchanged.
Properties as Kafka's: ``parse.key=true`` splits each line at the first
``key.separator`` (default a tab) into key and value; ``null.marker=X`` makes a value
equal to X a tombstone. The records of a run are written as one segment file at the end
of input (from a terminal: one per line, so each is readable at once), and a line on
standard error gives the offsets assigned.

``consume`` prints records from a start position and exits when it reaches the end of
the log (``--follow``: keeps polling for new records until ``--max-messages`` or
Ctrl-C). The start position of a partition, as Kafka's consumer picks it: the group's
committed offset; else the log start with ``--from-beginning`` (``auto.offset.reset=
earliest``), else the log end (``latest``: only records produced from then on). With
``--group`` the positions reached are committed at exit. The output is Kafka's
``DefaultMessageFormatter``: the value per line, preceded by the fields its properties
switch on (``print.timestamp``, ``print.partition``, ``print.offset``, ``print.headers``,
``print.key``; ``print.value=false`` drops the value), separated by ``key.separator``
(a tab), null as ``null.literal`` (``null``). ``--json`` prints a JSON object per record
instead (``topic``, ``partition``, ``offset``, ``timestamp``, ``key``, ``value``,
``headers``; bytes as UTF-8 text, or hex with ``--hex``).

``groups`` lists the groups with committed offsets, describes a group's positions and
lag (``GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG``, Kafka's columns; lag in
offsets, ``-`` for a partition the group never committed), or resets a group's offsets
on a topic (a dry run printing the new offsets unless ``--execute``; consumers of the
group should be stopped, or their next commit overwrites the reset).

Exit status: 0 done, 1 a corrupt or missing file (the error names it), 2 a usage
mistake (unknown topic, partition, group or property; bad offset), with a one-line
message.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TextIO

from dkvstream.storage.cli import UsageError, render_bytes, run_command
from dkvstream.storage.log.config import COMPACT, DELETE, ProducerConfig, TopicConfig
from dkvstream.storage.log.consumer import Consumer, all_committed_offsets, committed_offsets
from dkvstream.storage.log.errors import (
    InvalidConfigError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownTopicError,
)
from dkvstream.storage.log.log import Log
from dkvstream.storage.log.records import Record
from dkvstream.storage.objectstore import open_existing_store, open_object_store

PRODUCER_PROPERTIES = {"parse.key": "false", "key.separator": "\t", "null.marker": ""}
CONSUMER_PROPERTIES = {
    "print.timestamp": "false", "print.partition": "false", "print.offset": "false",
    "print.headers": "false", "print.key": "false", "print.value": "true",
    "key.separator": "\t", "line.separator": "\n", "headers.separator": ",",
    "headers.key.separator": ":", "null.literal": "null",
}
FLUSH_BYTES = ProducerConfig().max_file_bytes
GROUP_COLUMNS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")


def open_log(store: str, prefix: str, create: bool = False) -> Log:
    """The log at ``store``/``prefix``.

    Args:
        store: object-store root (path or URI).
        prefix: the log's prefix in the store.
        create: allow a local directory that does not exist yet (``create-topic``).

    Raises:
        UsageError: a local ``store`` that does not exist (so a misspelled path does not
            leave an empty directory behind), or, without ``create``, a log with no topic.
    """
    try:
        log = Log((open_object_store if create else open_existing_store)(store), prefix)
    except FileNotFoundError as e:
        raise UsageError(f"no log found under {store}: no such directory (check --store)") from e
    if not create and not log.metadata().topics:
        raise UsageError(f"no log found under {log.store.uri(log.prefix)}: no topics "
                         f"(check --store and --prefix, or create one with create-topic)")
    return log


def parse_properties(given: Sequence[str], known: dict[str, str]) -> dict[str, str]:
    """``--property name=value`` options over the defaults ``known``.

    Raises:
        UsageError: not ``name=value``, or a name not in ``known`` (the message lists them).
    """
    props = dict(known)
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise UsageError(f"unknown property {item!r}: use name=value with a name of {sorted(known)}")
        # A "\t" typed on a command line means a tab, as in Kafka's tools.
        props[name] = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
    return props


def _flag(props: dict[str, str], name: str) -> bool:
    value = props[name].lower()
    if value not in ("true", "false"):
        raise UsageError(f"property {name} must be true or false, got {props[name]!r}")
    return value == "true"


def produce_lines(log: Log, topic: str, lines: Iterable[bytes | str], props: dict[str, str],
                  flush_each: bool = False) -> dict[int, tuple[int, int]]:
    """Sends each line as one record (see the module docstring).

    Args:
        log: the log.
        topic: an existing topic.
        lines: the input lines, as bytes (standard input's, kept exact) or text (sent
            as UTF-8); a trailing line break is dropped.
        props: ``PRODUCER_PROPERTIES`` as given.
        flush_each: commit after every line (interactive input).

    Returns:
        ``{partition: (first offset, last offset)}`` assigned.

    Raises:
        UnknownTopicError: no such topic.
        UsageError: with ``parse.key``, a line without the separator (names the line).
        InvalidRecordError: a keyless record for a compacted topic.
    """
    log.metadata().topic(topic)  # an unknown topic fails before reading any input
    parse_key = _flag(props, "parse.key")
    sep, null = props["key.separator"].encode(), props["null.marker"].encode()
    # The producer never flushes on its own (it would not return the offsets): this loop
    # flushes every FLUSH_BYTES of input, at the end, and after each line if asked.
    producer = log.producer(ProducerConfig(linger_ms=10**12, max_file_bytes=1 << 62))
    assigned: dict[int, tuple[int, int]] = {}
    buffered = 0

    def flush() -> None:
        for (_, part), (first, last) in producer.flush().items():
            assigned[part] = (assigned.get(part, (first, last))[0], last)

    for n, line in enumerate(lines, 1):
        value = (line.encode() if isinstance(line, str) else line).rstrip(b"\r\n")
        key = None
        if parse_key:
            key, found, value = value.partition(sep)
            if not found:
                raise UsageError(f"line {n} has no key separator {sep.decode()!r} (parse.key=true): {key!r}")
        producer.send(topic, key, None if null and value == null else value)
        buffered += len(line) + 24
        if flush_each or buffered >= FLUSH_BYTES:
            flush()
            buffered = 0
    flush()
    return assigned


def start_positions(log: Log, topic: str, group: str | None, from_beginning: bool,
                    partition: int | None, offset: str | None) -> dict[tuple[str, int], int]:
    """Where ``consume`` starts in each partition (see the module docstring).

    Args:
        offset: ``earliest``, ``latest`` or an offset; needs ``partition``.

    Raises:
        UnknownTopicError: no such topic or partition.
        UsageError: ``offset`` without ``partition``, or not a number in the partition's
            ``[log start, log end]``.
    """
    md = log.metadata()
    parts = range(len(md.topic(topic).partitions)) if partition is None else [partition]
    committed = committed_offsets(log, group) if group else {}
    if offset is not None and partition is None:
        raise UsageError("--offset needs --partition (as kafka-console-consumer)")
    positions = {}
    for p in parts:
        state = md.partition(topic, p)
        if offset is not None:
            pos = {"earliest": state.log_start, "latest": state.next_offset}.get(offset)
            if pos is None:
                if not offset.isdigit() or not state.log_start <= int(offset) <= state.next_offset:
                    raise UsageError(f"--offset {offset!r}: give earliest, latest or an offset in "
                                     f"[{state.log_start}, {state.next_offset}] of {topic}/{p}")
                pos = int(offset)
        else:
            pos = committed.get((topic, p))
            if pos is None or not state.log_start <= pos <= state.next_offset:
                pos = state.log_start if from_beginning else state.next_offset
        positions[(topic, p)] = pos
    return positions


def format_record(partition: int, r: Record, props: dict[str, str]) -> str:
    """One record as Kafka's ``DefaultMessageFormatter`` prints it (module docstring)."""
    def text(b: bytes | None) -> str:
        return props["null.literal"] if b is None else b.decode("utf-8", "backslashreplace")

    fields = []
    if _flag(props, "print.timestamp"):
        fields.append(f"CreateTime:{r.timestamp}")
    if _flag(props, "print.partition"):
        fields.append(f"Partition:{partition}")
    if _flag(props, "print.offset"):
        fields.append(f"Offset:{r.offset}")
    if _flag(props, "print.headers"):
        fields.append(props["headers.separator"].join(
            f"{k}{props['headers.key.separator']}{text(v)}" for k, v in r.headers) or "NO_HEADERS")
    if _flag(props, "print.key"):
        fields.append(text(r.key))
    if _flag(props, "print.value"):
        fields.append(text(r.value))
    return props["key.separator"].join(fields) + props["line.separator"]


def record_json(topic: str, partition: int, r: Record, hex: bool) -> str:
    """One record as a JSON line (``consume --json``)."""
    return json.dumps({"topic": topic, "partition": partition, "offset": r.offset,
                       "timestamp": r.timestamp, "key": render_bytes(r.key, hex),
                       "value": render_bytes(r.value, hex),
                       "headers": [[k, render_bytes(v, hex)] for k, v in r.headers]}) + "\n"


def consume(log: Log, positions: dict[tuple[str, int], int], group: str | None, out: TextIO,
            write, max_messages: int | None = None, follow: bool = False,
            poll_ms: int = 500) -> int:
    """Reads from ``positions`` and writes each record with ``write(topic, partition,
    record)``, until the end of the log (``follow``: until ``max_messages`` or Ctrl-C);
    then commits the positions reached for ``group``.

    Returns:
        The number of records written.
    """
    consumer = Consumer(log, group)
    consumer.positions = dict(positions)
    n = 0
    try:
        while max_messages is None or n < max_messages:
            batch = consumer.poll(500 if max_messages is None else min(500, max_messages - n))
            for topic, part, r in batch:
                out.write(write(topic, part, r))
            n += len(batch)
            if not batch:
                if not follow:
                    break
                out.flush()
                time.sleep(poll_ms / 1000)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a --follow run; the positions of what was printed are committed
    if group:
        consumer.commit()
    return n


def describe_groups(log: Log, groups: dict[str, dict[tuple[str, int], int]]) -> list[tuple]:
    """Rows of ``groups --describe``: for each group and each partition of each topic it
    committed on, ``GROUP_COLUMNS`` (current offset and lag None where it never
    committed; log end and lag None for a topic that no longer exists)."""
    md = log.metadata()
    rows = []
    for group, offsets in sorted(groups.items()):
        for topic in sorted({t for t, _ in offsets}):
            t = md.topics.get(topic)
            parts = range(len(t.partitions)) if t else sorted(p for tt, p in offsets if tt == topic)
            for p in parts:
                current = offsets.get((topic, p))
                end = t.partitions[p].next_offset if t else None
                lag = None if current is None or end is None else end - current
                rows.append((group, topic, p, current, end, lag))
    return rows


def reset_offsets(log: Log, group: str, topic: str, to: str, offset: int | None,
                  execute: bool) -> dict[tuple[str, int], int]:
    """New offsets of ``group`` on every partition of ``topic``: the log start
    (``to="earliest"``), the log end (``"latest"``) or ``offset`` (``"offset"``, clamped
    to each partition's ``[log start, log end]`` as Kafka does); committed if ``execute``.

    Raises:
        UnknownTopicError: no such topic.
    """
    md = log.metadata()
    new = {}
    for p, state in enumerate(md.topic(topic).partitions):
        pos = {"earliest": state.log_start, "latest": state.next_offset}.get(to)
        if pos is None:
            pos = min(max(int(offset), state.log_start), state.next_offset)
        new[(topic, p)] = pos
    if execute:
        log.commit_group_offsets(group, new)
    return new


def print_columns(header: Sequence[str], rows: Iterable[Sequence], out: TextIO) -> None:
    """Left-aligned columns, ``-`` for None (as ``kafka-consumer-groups`` prints them)."""
    cells = [list(header)] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    for c in cells:
        out.write(" ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() + "\n")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dkvstream.storage.log.console", description=__doc__.split("\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", default=".dkvstream", help="object-store root (default .dkvstream)")
    common.add_argument("--prefix", default="log", help="the log's prefix in the store (default log)")
    sub = ap.add_subparsers(dest="command", required=True)
    ct = sub.add_parser("create-topic", parents=[common], help="create a topic (a no-op if it exists alike)")
    ct.add_argument("--topic", required=True)
    ct.add_argument("--partitions", type=int, default=1)
    ct.add_argument("--compact", action="store_true", help="cleanup.policy=compact")
    pp = sub.add_parser("produce", parents=[common], help="send standard input's lines as records")
    pp.add_argument("--topic", required=True)
    pp.add_argument("--property", action="append", default=[], help="parse.key, key.separator, null.marker")
    cp = sub.add_parser("consume", parents=[common], help="print records")
    cp.add_argument("--topic", required=True)
    cp.add_argument("--group", help="consumer group: start at its offsets, commit at exit")
    cp.add_argument("--from-beginning", action="store_true",
                    help="without a committed offset, start at the log start (else at the end)")
    cp.add_argument("--partition", type=int, help="only this partition")
    cp.add_argument("--offset", help="earliest, latest or an offset (needs --partition)")
    cp.add_argument("--max-messages", type=int, help="stop after this many records")
    cp.add_argument("--follow", action="store_true", help="keep polling at the end of the log")
    cp.add_argument("--property", action="append", default=[],
                    help="print.key, print.timestamp, print.partition, print.offset, ... (Kafka's)")
    cp.add_argument("--json", action="store_true", help="a JSON object per record")
    cp.add_argument("--hex", action="store_true", help="with --json: keys, values and headers as hex")
    gp = sub.add_parser("groups", parents=[common], help="list, describe or reset consumer groups")
    action = gp.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true")
    action.add_argument("--describe", action="store_true")
    action.add_argument("--reset-offsets", action="store_true")
    gp.add_argument("--group")
    gp.add_argument("--all-groups", action="store_true")
    gp.add_argument("--topic", help="the topic of --reset-offsets")
    to = gp.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-offset", type=int)
    gp.add_argument("--execute", action="store_true", help="commit the reset (default: a dry run)")
    return ap


def _groups(a: argparse.Namespace, out: TextIO) -> None:
    log = open_log(a.store, a.prefix)
    if a.list:
        for group in all_committed_offsets(log):
            out.write(group + "\n")
        return
    if a.describe:
        if a.all_groups == bool(a.group):
            raise UsageError("--describe needs --group G or --all-groups")
        groups = all_committed_offsets(log)
        if a.group:
            if a.group not in groups:
                raise UsageError(f"consumer group {a.group!r} has no committed offsets "
                                 f"(groups: {sorted(groups)})")
            groups = {a.group: groups[a.group]}
        print_columns(GROUP_COLUMNS, describe_groups(log, groups), out)
        return
    if not a.group or not a.topic:
        raise UsageError("--reset-offsets needs --group and --topic")
    to = "earliest" if a.to_earliest else "latest" if a.to_latest else "offset"
    if to == "offset" and a.to_offset is None:
        raise UsageError("--reset-offsets needs --to-earliest, --to-latest or --to-offset N")
    new = reset_offsets(log, a.group, a.topic, to, a.to_offset, a.execute)
    print_columns(("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
                  [(a.group, t, p, off) for (t, p), off in sorted(new.items())], out)
    if not a.execute:
        out.write("dry run: add --execute to commit these offsets\n")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, stdin: TextIO | None = None) -> int:
    """Runs the CLI; returns the exit status (0 done, 1 corrupt or missing file, 2 usage)."""
    out, stdin = out or sys.stdout, stdin or sys.stdin
    a = _parser().parse_args(argv)

    def command() -> None:
        if a.command == "create-topic":
            cfg = TopicConfig(partitions=a.partitions, cleanup_policy=COMPACT if a.compact else DELETE)
            open_log(a.store, a.prefix, create=True).create_topic(a.topic, cfg)
            out.write(f"created topic {a.topic} ({cfg.partitions} partitions, {cfg.cleanup_policy})\n")
        elif a.command == "produce":
            props = parse_properties(a.property, PRODUCER_PROPERTIES)
            # Standard input as bytes, so a record holds exactly the bytes of its line.
            lines = getattr(stdin, "buffer", stdin)
            assigned = produce_lines(open_log(a.store, a.prefix), a.topic, lines, props, stdin.isatty())
            ranges = ", ".join(f"{a.topic}/{p} {f}..{last}" for p, (f, last) in sorted(assigned.items()))
            print(f"produced {sum(last - f + 1 for f, last in assigned.values())} records"
                  f"{': ' + ranges if ranges else ''}", file=sys.stderr)
        elif a.command == "consume":
            props = parse_properties(a.property, CONSUMER_PROPERTIES)
            log = open_log(a.store, a.prefix)
            positions = start_positions(log, a.topic, a.group, a.from_beginning, a.partition, a.offset)
            write = ((lambda t, p, r: record_json(t, p, r, a.hex)) if a.json
                     else (lambda t, p, r: format_record(p, r, props)))
            n = consume(log, positions, a.group, out, write, a.max_messages, a.follow)
            print(f"Processed a total of {n} messages", file=sys.stderr)
        else:
            _groups(a, out)

    return run_command(command, (UsageError, UnknownTopicError, OffsetOutOfRangeError,
                                 InvalidRecordError, InvalidConfigError, TopicExistsError))


if __name__ == "__main__":
    sys.exit(main())
