"""The record buffer bounds memory by weight: module calls, not records."""

from __future__ import annotations

import threading

from auditlog.capture.buffer import RecordBuffer, record_weight


def activity(calls: int) -> tuple[object, ...]:
    entries = [{"module_id": i, "n_outputs": 0, "outputs": []} for i in range(calls)]
    return ("activity", 0, 1, None, None, {"forward": entries, "backward": []})


def other() -> tuple[object, ...]:
    return ("annotation", 0, 1, None, None, {"key": "k", "fields": {}})


def test_weights_count_module_calls_and_parameters() -> None:
    assert record_weight(activity(300)) == 300
    assert record_weight(activity(0)) == 1
    assert record_weight(other()) == 1
    step = ("optimizer_step", 0, 1, None, None, {"tensor_ids": list(range(100))})
    assert record_weight(step) == 5


def test_drain_takes_a_weight_not_a_count() -> None:
    buffer = RecordBuffer(maxsize=10_000)
    for _ in range(5):
        buffer.put(activity(100))
    buffer.put(other())
    assert buffer.weight == 501 and len(buffer) == 6
    first = buffer.drain(150)  # stops once 150 is reached: two records of 100
    assert len(first) == 2 and buffer.weight == 301
    rest = buffer.drain(10**9)
    assert len(rest) == 4 and buffer.weight == 0 and len(buffer) == 0


def test_producer_blocks_on_weight_until_the_writer_drains() -> None:
    buffer = RecordBuffer(maxsize=250)
    buffer.put(activity(200))  # under the bound
    done = threading.Event()

    def produce() -> None:
        buffer.put(activity(100))  # 300 > 250: must wait for the drain
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    # A blocked producer wakes the writer (``wakeup``) before it waits: wait for that
    # event, not for a fixed time, so a slow thread start cannot fail the test.
    assert buffer.wakeup.wait(10)
    assert not done.is_set() and buffer.weight == 200
    assert len(buffer.drain(10**9)) == 1
    assert done.wait(10)
    thread.join()
    assert buffer.weight == 100 and buffer.blocked_seconds > 0


def test_a_single_record_heavier_than_the_bound_is_accepted_when_empty() -> None:
    buffer = RecordBuffer(maxsize=10)
    buffer.put(activity(50))  # would never fit: taken rather than blocking forever
    assert buffer.weight == 50 and buffer.dropped == 0
