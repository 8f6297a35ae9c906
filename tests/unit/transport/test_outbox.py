"""The outbox of bulk transfers: what it parks, for how many readers, until when, and how much."""

from __future__ import annotations

import numpy as np

from weightstream.transport.outbox import ID_BYTES, Filling, Outbox


def _parts(*sizes: int) -> list[memoryview]:
    return [np.full(n, i, dtype=np.uint8).data for i, n in enumerate(sizes)]


def test_a_payload_is_parked_under_a_fresh_random_id_with_its_total() -> None:
    box = Outbox()
    a, b = box.offer(_parts(3, 5)), box.offer(_parts(3, 5))
    assert a is not None and b is not None and a != b and len(a) == ID_BYTES
    entry = box.take(a)
    assert entry is not None and not isinstance(entry, Filling)
    assert entry.total == 8 and [bytes(p) for p in entry.parts] == [b"\0\0\0", b"\1" * 5]


def test_a_payload_is_let_go_after_its_last_reader() -> None:
    box = Outbox()
    key = box.offer(_parts(4), readers=2)
    assert key is not None
    assert box.take(key) is not None and len(box) == 1
    assert box.take(key) is not None and len(box) == 0
    assert box.take(key) is None  # a third reader finds nothing


def test_released_and_unknown_ids_find_nothing() -> None:
    box = Outbox()
    key = box.offer(_parts(4))
    assert key is not None
    box.release(key)
    assert box.take(key) is None and len(box) == 0
    assert box.take(bytes(ID_BYTES)) is None
    box.release(bytes(ID_BYTES))  # letting go of what is not there is no error


def test_a_payload_past_its_deadline_is_gone() -> None:
    box = Outbox()
    key = box.offer(_parts(4), ttl_s=-1.0)
    assert key is not None and box.take(key) is None and len(box) == 0


def test_a_full_outbox_refuses_until_expired_entries_make_room() -> None:
    box = Outbox(max_entries=2)
    stale = box.offer(_parts(1), ttl_s=-1.0)
    live = box.offer(_parts(1))
    assert stale is not None and live is not None
    fresh = box.offer(_parts(1))  # the stale one is swept to make room
    assert fresh is not None and box.take(stale) is None
    assert box.offer(_parts(1)) is None and box.filling(8, 1) is None  # two live: full
    assert box.take(live) is not None  # a refusal loses nothing parked


def test_a_filling_payload_tells_its_waiters_what_has_arrived_and_why_it_failed() -> None:
    box = Outbox()
    parked = box.filling(10, readers=1)
    assert parked is not None
    key, filling = parked
    assert filling.buf.nbytes == 10 and filling.filled == 0
    filling.advance(4)
    assert filling.filled == 4
    filling.fail("upstream gone")
    assert filling.error == "upstream gone"
    assert box.take(key) is filling
