"""Bloom filter: no false negatives, false-positive rate near theory, stable encoding."""

from __future__ import annotations

from dkvstream.storage.dkv.bloom import POLICY_NAME, build_bloom, may_contain, num_probes


def test_no_false_negatives() -> None:
    keys = [b"key-%d" % i for i in range(5000)]
    k, bits = build_bloom(keys, 10)
    assert all(may_contain(bits, k, key) for key in keys)


def test_false_positive_rate_at_10_bits_per_key() -> None:
    keys = [b"in-%d" % i for i in range(20000)]
    k, bits = build_bloom(keys, 10)
    probes = [b"out-%d" % i for i in range(50000)]
    fp = sum(may_contain(bits, k, p) for p in probes) / len(probes)
    assert fp < 0.03  # theory: ~0.8% at 10 bits/key, k=7


def test_fewer_bits_more_false_positives() -> None:
    keys = [b"in-%d" % i for i in range(5000)]
    probes = [b"out-%d" % i for i in range(20000)]
    k4, b4 = build_bloom(keys, 4)
    k12, b12 = build_bloom(keys, 12)
    fp4 = sum(may_contain(b4, k4, p) for p in probes)
    fp12 = sum(may_contain(b12, k12, p) for p in probes)
    assert fp4 > fp12


def test_sizes_and_probes() -> None:
    assert num_probes(10) == 7
    assert num_probes(1) == 1
    k, bits = build_bloom([], 10)
    assert len(bits) == 8  # the 64-bit minimum
    k, bits = build_bloom([b"x"] * 100, 10)
    assert len(bits) * 8 == 1000


def test_encoding_is_stable() -> None:
    # If this changes, POLICY_NAME must change too (tables on the bucket depend on it).
    k, bits = build_bloom([b"alpha", b"beta"], 10)
    assert POLICY_NAME == "dkv.bloom.xxh64-dh.v1"
    assert (k, bits.hex()) == (7, "107f200240048000")  # golden value
    assert build_bloom([b"beta", b"alpha"], 10) == (k, bits)  # order-independent
    assert may_contain(bits, k, b"alpha") and may_contain(bits, k, b"beta")
