"""Random puts and deletes applied both to a DKV instance and to a plain dict, the oracle
the DKV tests compare scans and gets against."""

from __future__ import annotations

import random

from dkvstream.storage.dkv import DKV


def random_writes(
    db: DKV,
    model: dict[bytes, bytes],
    rng: random.Random,
    n: int,
    *,
    keys: range,
    delete_share: float,
    value_bytes: tuple[int, int],
    key_format: bytes = b"k%04d",
) -> None:
    """Applies ``n`` random writes to ``db`` and the same writes to ``model``.

    Each write draws a key number from ``keys`` and formats it with ``key_format``; with
    probability ``delete_share`` it deletes that key, otherwise it puts random bytes of a
    length drawn from ``value_bytes``. The same ``rng`` state gives the same writes.

    Args:
        db: the DKV instance written to.
        model: the live keys and values ``db`` must hold; updated in place.
        rng: the source of every random choice.
        n: how many writes (puts and deletes together).
        keys: the key numbers to draw from (a ``range`` with step 1).
        delete_share: probability in [0, 1] that a write is a delete.
        value_bytes: (smallest, largest) value length in bytes, both included.
        key_format: ``bytes`` %-format turning a key number into a key.
    """
    for _ in range(n):
        key = key_format % rng.randrange(keys.start, keys.stop)
        if rng.random() < delete_share:
            db.delete(key)
            model.pop(key, None)
        else:
            value = rng.randbytes(rng.randint(*value_bytes))
            db.put(key, value)
            model[key] = value
