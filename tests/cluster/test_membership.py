"""Ray's node list unreadable, then answering again: the outage a front door reports, on records."""

from __future__ import annotations

from fitevict.cluster.membership import Membership, describe


def test_an_outage_runs_from_the_first_failed_read_to_the_first_answer_and_keeps_what_changed() -> None:
    m = Membership()
    assert m.answered(100.0, set(), set()) is None and m.row(100.0)["membership"] == "ok"
    assert m.unanswered(101.0, "no answer within 2 s")
    assert not m.unanswered(103.0, "GcsUnavailable: refused")  # the same outage, its latest reason
    down = m.row(104.5)
    assert down["membership"] == "unreadable" and down["down"]["since"] == 101.0
    assert down["down"]["seconds"] == 3.5 and down["down"]["why"] == "GcsUnavailable: refused"
    ended = m.answered(109.0, {"n2"}, {"n4", "n3"})
    assert ended is not None and (ended.until, ended.left, ended.joined) == (109.0, ("n2",), ("n3", "n4"))
    row = m.row(200.0)
    assert row["membership"] == "ok" and row["down"] is None and row["outages"] == 1
    assert row["last_outage"]["seconds"] == 8.0 and row["read_at"] == 200.0 - 91.0
    assert "8 s" in describe(ended) and "n2" in describe(ended) and "n3, n4" in describe(ended)
    assert m.answered(110.0, set(), {"n5"}) is None  # no outage: nothing to report
    assert m.row(110.0)["last_outage"]["joined"] == ["n3", "n4"]


def test_an_outage_says_how_long_before_ray_ends_the_front_door() -> None:
    m = Membership(reconnect_s=60)
    m.unanswered(100.0, "no answer within 2 s")
    assert m.row(145.5)["down"]["ends_in_s"] == 14.5 and m.row(145.5)["gcs_reconnect_s"] == 60
    assert m.row(170.0)["down"]["ends_in_s"] == 0.0
    unknown = Membership()
    unknown.unanswered(100.0, "no answer within 2 s")
    assert "ends_in_s" not in unknown.row(101.0)["down"]  # no limit known: nothing said
