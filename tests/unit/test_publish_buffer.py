"""The publish throttle's rules, without sockets: what pauses, what resumes, and when."""

from __future__ import annotations

from keyshared.server.publish_buffer import PublishThrottle


class Conn:
    """A connection as the throttle sees it: whether it reads, whether it has a producer."""

    def __init__(self, producers: bool = True) -> None:
        self.reading = True
        self.producers = producers

    def set_reading(self, reading: bool) -> None:
        self.reading = reading

    def has_producers(self) -> bool:
        return self.producers


def test_the_buffer_pauses_producer_connections_and_resumes_at_half() -> None:
    t = PublishThrottle(max_buffer_bytes=1000, max_pending_per_connection=0)
    a, b, consumer_only = Conn(), Conn(), Conn(producers=False)
    sa, sb = t.attach(a), t.attach(b)
    t.attach(consumer_only)
    sa.started(600)
    assert a.reading and not t.paused
    sb.started(600)  # 1200 > 1000
    assert t.paused and not a.reading and not b.reading
    assert consumer_only.reading
    assert t.throttled_connections_global_limit == 2
    sa.finished(600)  # 600: not yet at half
    assert not a.reading
    sb.started(0)
    sb.finished(100)  # 500: half
    assert a.reading and b.reading and not t.paused
    assert t.max_usage == 1200 and t.global_pauses == 1


def test_a_producer_connecting_while_paused_is_paused_on_its_first_send() -> None:
    t = PublishThrottle(max_buffer_bytes=100, max_pending_per_connection=0)
    a = Conn()
    sa = t.attach(a)
    sa.started(200)
    late = Conn()
    sl = t.attach(late)
    sl.started(10)
    assert not late.reading
    sa.finished(200)
    assert late.reading


def test_the_per_connection_limit_pauses_that_connection_alone() -> None:
    t = PublishThrottle(max_buffer_bytes=0, max_pending_per_connection=4)
    a, b = Conn(), Conn()
    sa, sb = t.attach(a), t.attach(b)
    for _ in range(4):
        sa.started(1)
    sb.started(1)
    assert not a.reading and b.reading
    assert t.throttled_connections == 1
    sa.finished(1)
    assert not a.reading  # 3 in flight: above half of 4
    sa.finished(1)
    assert a.reading and t.throttled_connections == 0


def test_a_closed_connection_is_never_resumed_and_its_sends_still_drain() -> None:
    t = PublishThrottle(max_buffer_bytes=100, max_pending_per_connection=0)
    a = Conn()
    sa = t.attach(a)
    sa.started(150)
    assert not a.reading
    sa.close()
    sa.finished(150)
    assert t.usage == 0 and not t.paused
    assert not a.reading  # gone: nothing is called on it any more
