"""State schemas across releases: what a checkpoint records of each state, the check a
restart makes against the new code, and the codecs the tasks read state with.

Like Flink's serializer snapshots (``TypeSerializerSnapshot``, written into every
checkpoint and asked at restore whether the new serializer is compatible) and Avro's
schema resolution (an entry is read by the writer's schema resolved to the reader's).
The checkpoint's ``state_schemas`` holds, per operator and state id::

    {"kind": "value" | "list" | "map",
     "key_codec": str | None,        # MapSpec: the map-key codec's name, never changes
     "value_codec": str,             # the value codec's name, or "record" for a RecordCodec
     "ttl": None | "event" | "processing",   # the clock of its StateTtl (absent: None)
     "versions": [[[field, type], ...], ...]}   # RecordCodec only: its fields, oldest
                                                # version first; [] for other codecs

A restart (``evolve_job``, in the driver before the first epoch) compares each declared
state with its record: the same record fields keep the newest version; fields that can
read every recorded version (``codecs.resolution_problem``: add, drop, reorder, widen)
become a new version; anything else is a ``StateSchemaError``, and so is adding or
removing a TTL or changing its clock (a TTL'd state's entries sit under another key
schema byte, so the new declaration would never see the old entries, and they would
never expire; Flink refuses such a restore too). Changing ``ttl_ms`` or ``update`` is
allowed: an entry keeps the expiry it was written with. Nothing is rewritten:
an entry keeps the version it was written with until the operator writes it again, and
``RecordCodec.bind`` reads it in the new fields. Each task binds its operator's specs to
the history (``bind_operator``); a record of a state the code no longer declares is kept,
so a state id declared again later is checked against the entries it left.
"""
from __future__ import annotations

from typing import Any

from dkvstream.operators.api.codecs import Codec, RecordCodec, resolution_problem
from dkvstream.operators.api.state import ListSpec, MapSpec, state_specs
from dkvstream.operators.errors import StateSchemaError

#: ``{operator name: {state id: record}}`` (module docstring).
StateSchemas = dict[str, dict[str, dict[str, Any]]]


def _kind(spec: Any) -> str:
    return "map" if isinstance(spec, MapSpec) else "list" if isinstance(spec, ListSpec) else "value"


def _value_attr(spec: Any) -> str:
    """The spec's attribute holding its value codec."""
    return "value_codec" if isinstance(spec, MapSpec) else "codec"


def describe(spec: Any) -> dict[str, Any]:
    """The record of a declared state spec, with its codec's fields as the one version."""
    value: Codec = getattr(spec, _value_attr(spec))
    is_record = isinstance(value, RecordCodec)
    return {"kind": _kind(spec),
            "key_codec": spec.key_codec.name if isinstance(spec, MapSpec) else None,
            "value_codec": "record" if is_record else value.name,
            "ttl": spec.ttl.time if spec.ttl is not None else None,
            "versions": [[list(f) for f in value.schema_fields()]] if is_record else []}


def evolve(operator: str, state_id: str, recorded: dict[str, Any] | None, spec: Any,
           epoch: int = 0) -> dict[str, Any]:
    """The record of ``spec`` after a restart from a checkpoint holding ``recorded``.

    Args:
        operator: the operator's name; state_id: the state's id (both for the message).
        recorded: the checkpoint's record of the state, or None (a new state).
        spec: the declared spec.
        epoch: the checkpoint's epoch, for the message.

    Returns:
        ``recorded`` unchanged when the declaration matches its newest version, else
        the record with the declared fields as a new version (or ``describe(spec)``
        for a new state).

    Raises:
        StateSchemaError: the declaration cannot read the recorded entries.
    """
    now = describe(spec)
    if recorded is None:
        return now
    where = f"operator {operator!r} state {state_id!r}"
    fix = (f" The checkpoint of epoch {epoch} holds entries written the old way, and state is "
           "read lazily, never rewritten. Declare the state as before; to change it, declare a new "
           "state id (and copy what you need into it), or run the job under a new name from empty state.")
    if recorded["kind"] != now["kind"]:
        raise StateSchemaError(f"{where}: was a {recorded['kind']} state, is declared as a {now['kind']} "
                               f"state." + fix)
    if recorded.get("key_codec") != now["key_codec"]:
        raise StateSchemaError(f"{where}: its map keys were encoded by {recorded.get('key_codec')}, are "
                               f"declared with {now['key_codec']}: a new key codec (map keys are stored "
                               f"bytes, they cannot be read by another codec)." + fix)
    if recorded["value_codec"] != now["value_codec"]:
        raise StateSchemaError(f"{where}: its values were encoded by {recorded['value_codec']}, are declared "
                               f"with {now['value_codec']}: a new value codec." + fix)
    if recorded.get("ttl") != now["ttl"]:
        def said(ttl: str | None) -> str:
            return "without a TTL" if ttl is None else f"with {'an' if ttl == 'event' else 'a'} {ttl}-time TTL"
        raise StateSchemaError(f"{where}: was declared {said(recorded.get('ttl'))}, is declared "
                               f"{said(now['ttl'])}: a TTL's clock decides where entries are stored, so "
                               f"the new declaration would not see the old entries (and they would never "
                               f"expire)." + fix)
    versions = recorded["versions"]
    if not now["versions"] or (versions and versions[-1] == now["versions"][0]):
        return recorded  # the same codec, or the same record fields as the newest version
    codec: RecordCodec = getattr(spec, _value_attr(spec))
    for w, writer in enumerate(versions):
        problem = resolution_problem([tuple(f) for f in writer], codec)
        if problem is not None:
            raise StateSchemaError(f"{where}: {problem} (entries of schema version {w} hold it; their "
                                   f"fields: {', '.join(f'{n}: {t}' for n, t in writer)})." + fix)
    return {**recorded, "versions": [*versions, now["versions"][0]]}


def evolve_job(operators: list[Any], recorded: StateSchemas, epoch: int = 0) -> StateSchemas:
    """``evolve`` of every state the operators declare; records of operators and
    states no longer declared are kept as they are.

    Args:
        operators: the job's operators.
        recorded: the checkpoint's ``state_schemas`` ({} for a new job).
        epoch: the checkpoint's epoch, for messages.

    Raises:
        StateSchemaError: the first state whose declaration cannot read its entries.
    """
    out: StateSchemas = {op: dict(states) for op, states in recorded.items()}
    for operator in operators:
        states = out.setdefault(operator.name, {})
        for state_id, spec in state_specs(operator).items():
            states[state_id] = evolve(operator.name, state_id, states.get(state_id), spec, epoch)
    return out


def bound_value_codec(spec: Any, record: dict[str, Any] | None) -> Codec:
    """The codec to read and write ``spec``'s values with: its ``RecordCodec`` bound to
    the recorded versions (``RecordCodec.bind``), or its value codec as declared.

    Raises:
        ValueError: the record's newest version is not the declared fields (the
            record was not made by ``evolve`` for this declaration).
    """
    declared = _declared(spec)
    if not isinstance(declared, RecordCodec) or not record or not record.get("versions"):
        return declared
    versions = tuple(tuple((n, t) for n, t in v) for v in record["versions"])
    for codec in (getattr(spec, _value_attr(spec)), declared):  # already bound so: the same object
        if isinstance(codec, RecordCodec) and codec.versions == versions:
            return codec
    return declared.bind(versions)


def _declared(spec: Any) -> Codec:
    """The value codec ``spec`` was declared with. Binding replaces it on the spec object,
    which the operator class's instances share, so it is kept aside at the first look:
    a later job in the same process (another history, or none) binds from it again."""
    declared = spec.__dict__.get("_declared_value_codec")
    if declared is None:
        declared = spec.__dict__["_declared_value_codec"] = getattr(spec, _value_attr(spec))
    return declared


def bind_operator(operator: Any, schemas: dict[str, dict[str, Any]] | None) -> None:
    """Points each of ``operator``'s state specs at ``bound_value_codec`` of its record
    in ``schemas`` (``{state id: record}``, the operator's part of ``evolve_job``'s
    result; None or {}: the declared codecs, undoing a binding another job in this
    process made). Idempotent and cheap when already bound: a task calls it every epoch."""
    for state_id, spec in state_specs(operator).items():
        codec = bound_value_codec(spec, (schemas or {}).get(state_id))
        if codec is not getattr(spec, _value_attr(spec)):
            setattr(spec, _value_attr(spec), codec)
