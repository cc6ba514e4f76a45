"""The OpenFlow port numbers the CNI server asks vswitchd for: free ones, round-robin, never a held one."""

from __future__ import annotations

import threading

import pytest

from policy_agent.cni.ofports import OfportPool


def test_numbers_in_use_are_read_once_at_the_first_take_and_skipped() -> None:
    reads: list[int] = []

    def in_use() -> set[int]:
        reads.append(1)
        return {3, 5, 99}  # 99 is outside the range: ignored

    pool = OfportPool(in_use, first=1, last=10)
    assert reads == []  # nothing read before a number is needed
    # Round-robin after the highest number in use, then from the bottom, skipping held ones.
    assert [pool.take() for _ in range(7)] == [6, 7, 8, 9, 10, 1, 2]
    assert pool.take() == 4
    assert reads == [1]
    with pytest.raises(RuntimeError, match="no free OpenFlow port number in 1..10"):
        pool.take()


def test_a_released_number_comes_back_last_and_a_held_one_never() -> None:
    pool = OfportPool(lambda: (), first=1, last=4)
    assert [pool.take(), pool.take()] == [1, 2]
    pool.release(1)
    pool.hold(3)  # vswitchd gave 3 to a port of someone else
    assert pool.take() == 4
    assert pool.take() == 1  # wrapped round to the freed one
    with pytest.raises(RuntimeError):
        pool.take()
    pool.release(2)
    assert pool.take() == 2


def test_concurrent_takes_never_hand_out_one_number_twice() -> None:
    pool = OfportPool(lambda: {100}, first=100, last=2099)
    got: list[int] = []
    lock = threading.Lock()

    def taker() -> None:
        mine = [pool.take() for _ in range(249)]  # 8 x 249 of the 1,999 free numbers
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=taker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 8 * 249
    assert 100 not in got
