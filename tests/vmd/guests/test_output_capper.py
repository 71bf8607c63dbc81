"""The guest's output capper (vmd/guests/output.py `_CappedStream`): a command's output keeps its
head and its tail, says how much was cut between them, and never grows past its limits."""

from __future__ import annotations

from vmd.config import VmdConfig
from vmd.guests.output import DEFAULT_BOUNDS, _CappedStream


def test_output_within_the_limits_is_kept_whole():
    capped = _CappedStream(head=10, tail=10)
    for piece in (b"hello ", b"world", b"!\n"):
        capped.add(piece)
    assert capped.dropped == 0 and capped.text() == "hello world!\n"


def test_long_output_keeps_head_and_tail_and_says_how_much_was_cut():
    capped = _CappedStream(head=5, tail=5)
    capped.add(b"HEAD-" + b"x" * 100 + b"-TAIL")
    assert capped.dropped == 100
    assert capped.text() == "HEAD-\n[... 100 bytes of output cut here; the head and tail are kept ...]\n-TAIL"


def test_the_tail_is_the_last_bytes_however_the_output_was_chunked():
    data = bytes(range(256)) * 40
    for size in (1, 7, 64, 4096):
        capped = _CappedStream(head=100, tail=300)
        for start in range(0, len(data), size):
            capped.add(data[start:start + size])
        assert bytes(capped.head) == data[:100]
        assert b"".join(capped.tail) == data[-300:]
        assert capped.tail_size == 300 and capped.dropped == len(data) - 400


def test_a_character_split_by_the_cut_is_replaced_not_raised():
    capped = _CappedStream(head=1, tail=1)
    capped.add("é…é".encode())  # multi-byte characters cut in the middle
    assert "\ufffd" in capped.text()


def test_the_default_limits_bound_a_flood():
    head, tail = DEFAULT_BOUNDS.head, DEFAULT_BOUNDS.tail
    assert (head, tail) == (VmdConfig().output_head_bytes, VmdConfig().output_tail_bytes), "the config's defaults"
    capped = _CappedStream()
    for _ in range(200):
        capped.add(b"y" * 65536)
    assert len(capped.head) == head and capped.tail_size == tail
    assert capped.dropped == 200 * 65536 - head - tail
