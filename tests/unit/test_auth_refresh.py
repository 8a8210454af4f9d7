"""AuthRefresh: when a connection asks for fresh credentials, and when it gives up."""

from __future__ import annotations

from keyshared.server.auth_refresh import AuthRefresh


def _refresh(supports: bool = True) -> tuple[AuthRefresh, list[str]]:
    events: list[str] = []
    r = AuthRefresh(
        supports_refresh=supports,
        challenge=lambda: events.append("challenge"),
        close=lambda why: events.append("close: " + why),
    )
    return r, events


def test_no_expiry_or_not_yet_expired_does_nothing() -> None:
    r, events = _refresh()
    r.authenticated(None)
    r.check(1e12)
    r.authenticated(100.0)
    r.check(99.0)
    assert events == []


def test_expired_is_challenged_once_then_closed_if_not_answered() -> None:
    r, events = _refresh()
    r.authenticated(100.0)
    r.check(101.0)
    assert events == ["challenge"] and r.pending
    r.check(102.0)
    assert events[-1].startswith("close: ") and "not refreshed" in events[-1]


def test_an_answer_renews_and_clears_the_pending_challenge() -> None:
    r, events = _refresh()
    r.authenticated(100.0)
    r.check(101.0)
    r.authenticated(200.0)
    r.check(150.0)
    assert events == ["challenge"] and not r.pending
    r.check(201.0)
    assert events == ["challenge", "challenge"]


def test_a_client_that_cannot_refresh_is_closed_at_expiry() -> None:
    r, events = _refresh(supports=False)
    r.authenticated(100.0)
    r.check(99.5)
    assert events == []
    r.check(101.0)
    assert len(events) == 1 and "cannot refresh" in events[0]
