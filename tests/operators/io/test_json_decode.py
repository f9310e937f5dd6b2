"""``decode_json_values``' Arrow fast path against the per-record path it stands for: the
same columns and the same error per record on random JSON, bad values included."""
from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dkvstream.operators.io.topics import (
    _decode_json_arrow,
    decode_json_values,
    decode_json_values_per_record,
)

SCHEMA = pa.schema([("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()), ("b", pa.bool_()),
                    ("u8", pa.uint8()), ("f32", pa.float32())])

# Cell values: mostly of the right JSON type, often of the wrong one or out of range.
cells = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70), st.integers(-300, 300),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e6, 1e6),
    st.text(max_size=8), st.text(alphabet=st.characters(max_codepoint=0x7f), max_size=4),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=1))
objects = st.dictionaries(st.sampled_from(["i", "f", "s", "b", "u8", "f32", "other"]), cells, max_size=6)


@st.composite
def values(draw) -> bytes | None:
    """One record value: a JSON object as a producer writes it (spacing varies), or a
    bad one: another JSON type, broken text, two objects, invalid UTF-8, null."""
    obj = draw(objects)
    text = json.dumps(obj, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
                      ensure_ascii=draw(st.booleans()))
    kind = draw(st.sampled_from(["ok"] * 16 + ["other-type", "truncated", "two", "bytes", "null", "space",
                                              "newline", "duplicate"]))
    if kind == "other-type":
        text = json.dumps(draw(cells))
    elif kind == "truncated":
        text = text[:draw(st.integers(0, max(0, len(text) - 1)))]
    elif kind == "two":
        text = text + draw(st.sampled_from(["", " ", "null", "{}"])) + text
    elif kind == "bytes":
        return draw(st.binary(max_size=12))
    elif kind == "null":
        return None
    elif kind == "space":
        text = draw(st.sampled_from([" ", "\t", "\r", ""])) + text + draw(st.sampled_from([" ", "\t", ""]))
    elif kind == "newline":
        text = text.replace(",", ",\n", 1)
    elif kind == "duplicate" and text.startswith("{") and len(text) > 2:
        text = '{"i": 1, "i": 2, ' + text[1:]
    return text.encode()


def _cells(columns: dict[str, pa.Array]) -> dict[str, list]:
    # NaN never reaches a column (it is an error), so == is exact.
    return {name: array.to_pylist() for name, array in columns.items()}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(values(), min_size=1, max_size=12))
def test_fast_path_equals_per_record_path(raw) -> None:
    fast_columns, fast_errors = decode_json_values(raw, SCHEMA)
    slow_columns, slow_errors = decode_json_values_per_record(raw, SCHEMA)
    assert fast_errors.to_pylist() == slow_errors.to_pylist()
    assert _cells(fast_columns) == _cells(slow_columns)
    assert {n: a.type for n, a in fast_columns.items()} == {n: a.type for n, a in slow_columns.items()}


# Numbers and strings without a control character or a run of 8 digits (those take the
# per-record path by design: ``_CONTROL``, ``_LONG_DIGITS``).
short_floats = st.integers(-2**20, 2**20).map(lambda x: x / 8)  # exact in float32 too
plain_text = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Nd")))


@settings(max_examples=100)
@given(st.lists(st.fixed_dictionaries({}, optional={
    "i": st.integers(-9_999_999, 9_999_999) | st.none(), "f": short_floats | st.integers(-9_999_999, 9_999_999),
    "s": plain_text, "b": st.booleans(), "u8": st.integers(0, 255), "f32": short_floats,
    "other": st.lists(st.integers(-10**6, 10**6), max_size=2)}), min_size=1, max_size=20))
def test_good_values_take_the_fast_path_and_decode_as_written(rows) -> None:
    """Values every column holds as written: the fast path takes them (it is not a path
    that always gives up) and yields what ``pa.array`` makes of the Python values."""
    raw = [json.dumps(r, ensure_ascii=False).encode() for r in rows]
    fast = _decode_json_arrow(raw, SCHEMA)
    assert fast is not None
    columns, errors = fast
    assert errors.null_count == len(raw)
    assert _cells(columns) == {f.name: pa.array([r.get(f.name) for r in rows], f.type).to_pylist()
                               for f in SCHEMA}


def test_a_bad_value_sends_the_whole_batch_to_the_per_record_path() -> None:
    raw = [b'{"i": 1, "s": "a"}', b'{"i": 6.5}', b'{"i": true}', b'null', b'[1]', b'{"f": NaN}', None,
           b'{"s": "tab\there"}', b'{"f": 9007199254740993}']
    columns, errors = decode_json_values(raw, SCHEMA)
    assert _decode_json_arrow(raw, SCHEMA) is None
    msgs = errors.to_pylist()
    assert msgs[0] is None and columns["i"][0].as_py() == 1 and columns["s"][0].as_py() == "a"
    assert "fraction or exponent" in msgs[1] and "not a number" in msgs[2]
    assert "not an object" in msgs[3] and "not an object" in msgs[4]
    assert "NaN" in msgs[5] and msgs[6] is None
    assert msgs[7].startswith("JSONDecodeError") and "exactly representable" in msgs[8]
    assert columns["i"].to_pylist()[1:] == [None] * (len(raw) - 1)
