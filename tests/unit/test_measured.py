"""What a daemon measures for crnet tune (crnet.measure.windows): bounded windows, kept once per
step; and the measured status section, checked field by field (crnet.protocol.status_measured)."""

from __future__ import annotations

import time

import msgpack
import pytest

from crnet.coding.plan import Tree
from crnet.errors import ProtocolError
from crnet.measure.stats import Stats
from crnet.measure.windows import MAX_PROCESSES_SHOWN, Measured
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.node.observe.measure import LINKS_LISTED_MAX, MEASURED_BUDGET, MeasuredView
from crnet.protocol.messages import parse
from crnet.protocol.status_measured import measured_entry
from crnet.protocol.wire import MsgType
from crnet.schemes.base import Place


def test_compute_time_runs_from_an_answer_to_the_next_submit():
    m = Measured(window=4)
    m.submitted(0, 0)                      # its first step: nothing to measure from
    assert m.compute == {}
    m.answered(0)
    time.sleep(0.02)
    m.submitted(0, 1)
    (step, seconds), = m.compute[0]
    assert step == 1 and 0.02 <= seconds < 1.0
    m.submitted(0, 2)                      # no answer since: not counted twice
    assert len(m.compute[0]) == 1
    m.answered(0)
    m.attached(0)                          # another process took the seat
    m.submitted(0, 3)
    assert len(m.compute[0]) == 1
    m.answered(None)                       # a process without a seat yet: nothing
    m.submitted(None, 4)
    for step in range(5, 20):              # bounded by the window
        m.answered(1)
        m.submitted(1, step)
    assert [s for s, _ in m.compute[1]] == [16, 17, 18, 19]


def test_arrivals_count_from_the_previous_decision_and_periods_between_decisions():
    m = Measured(window=8)
    m.arrived(0, {0: time.perf_counter()})   # no step decided before it: no start
    assert m.arrivals == {}
    start = time.perf_counter()
    m.decided(0)
    m.arrived(1, {0: start + 0.005, 1: start + 0.010, 2: start - 1.0})   # 2: overlapping
    m.decided(1)
    m.arrived(1, {0: start + 0.5})           # counted just after the decision too
    assert [x for _, x in m.arrivals[0]] == pytest.approx([0.005, 0.5], abs=1e-3)
    assert [x for _, x in m.arrivals[1]] == pytest.approx([0.010], abs=1e-3)
    assert 2 not in m.arrivals
    m.decided(3)                             # a gap: no period
    m.decided(4)
    assert [s for s, _ in m.periods] == [1, 4]
    m.arrived(9, {0: time.perf_counter()})   # not right after a decision here: not counted
    assert len(m.arrivals[0]) == 2


def test_the_snapshot_is_cut_to_the_newest_steps():
    m = Measured(window=64)
    for seat in range(MAX_PROCESSES_SHOWN + 3):
        for step in range(10):
            m.answered(seat)
            m.submitted(seat, step)
    snap = m.snapshot(limit=3)
    assert len(snap["compute"]) == MAX_PROCESSES_SHOWN
    assert all(c["steps"] == [7, 8, 9] and len(c["micros"]) == 3 for c in snap["compute"])
    assert all(type(x) is int for c in snap["compute"] for x in c["micros"])
    assert m.snapshot(limit=0)["compute"][0]["steps"] == []
    with pytest.raises(ValueError):
        Measured(window=0)


def good_section(**changes):
    w = {"steps": [1, 2], "micros": [10, 20]}
    doc = {"window": 64, "processes": 1, "local_samples": 5,
           "compute": [{"process": 0, **w}], "arrivals": [{"child": 1, **w}], "periods": w,
           "links": [{"link": "child", "peer": "0", "up": True, "rtt_us": 5, "min_rtt_us": 3,
                      "bytes": 100, "busy_us": 4000, "rate": 10 ** 9}],
           "summed": {"links": 3, "bytes": 9, "busy_us": 1, "min_rtt_us": None, "rate": None},
           "config": {"scheme": "cr", "fanout": [2], "stragglers": [1], "samples": 10,
                      "chunk_bytes": 0, "vector_bytes": 40}}
    doc.update(changes)
    return doc


@pytest.mark.parametrize("changes, field", [
    ({"window": 10 ** 6}, "window"),
    ({"compute": [{"process": 0, "steps": [1], "micros": []}]}, "micros"),
    ({"compute": [{"process": 0, "steps": list(range(300)), "micros": [1] * 300}]}, "steps"),
    ({"compute": [{"process": k, "steps": [], "micros": []} for k in range(9)]}, "compute"),
    ({"periods": {"steps": [1], "micros": [-5]}}, "micros"),
    ({"periods": {"steps": [1], "micros": [1.5]}}, "micros"),
    ({"links": [{"link": "sideways", "peer": "0", "up": True}]}, "link"),
    ({"config": {"scheme": "cr", "fanout": [], "stragglers": [1], "samples": 10,
                 "chunk_bytes": 0, "vector_bytes": 40}}, "fanout"),
    ({"arrivals": "many"}, "arrivals"),
])
def test_a_malformed_section_is_an_error_naming_the_field_and_the_node(changes, field):
    assert measured_entry(good_section())["links"][0]["rate"] == 10 ** 9
    assert measured_entry(None) is None
    with pytest.raises(ProtocolError, match=field):
        measured_entry(good_section(**changes))
    node = {"name": "", "host": None, "address": None, "state": "joined", "tree_step": 0,
            "steps_done": 0, "last_step_seconds": None, "straggled": None, "recent": None,
            "measured": good_section(), "children": []}
    child = dict(node, name="0.1", measured=good_section(**changes))
    with pytest.raises(ProtocolError, match=f"node '0.1'.*{field}"):
        parse(MsgType.STATUS_REPLY, {"id": 1, "node": dict(node, children=[child])}, 0)


def test_a_big_trees_sections_stay_bounded():
    """In a tree of 1,641 hosts, a master with 8 processes and 40 children, every window
    full (256 steps): each window is cut so that the whole tree's stay within the budget,
    its links are summed, and what it says passes the check."""
    place = Place("", 0, Tree((40, 40), (1, 1)), "cr", "auto", 0)
    measured = Measured(window=256)
    for step in range(300):
        for seat in range(8):
            measured.answered(seat)
            measured.submitted(seat, step)
        measured.decided(step)
        measured.arrived(step + 1, {k: time.perf_counter() for k in range(40)})
    nb = Neighbours()
    nb.slots = [ChildSlot() for _ in range(40)]
    view = MeasuredView(Stats(measured=measured), nb, place=lambda: place, samples=lambda: 4000,
                        local_samples=lambda: 0, processes=8, tree_vector=lambda: (1000, "float32"))
    small = view.section(256)
    hosts = place.tree.workers + 1
    assert hosts > LINKS_LISTED_MAX and small["links"] == []
    limit = max(len(w["steps"]) for w in [*small["compute"], *small["arrivals"], small["periods"]])
    assert limit >= 1 and hosts * 10 * limit * 12 <= MEASURED_BUDGET
    assert len(msgpack.packb(small)) < 4096
    assert measured_entry(small)["config"]["vector_bytes"] == 4000
    # In a small tree the whole window goes, and every tree link is listed.
    place = Place("", 0, Tree((4,), (1,)), "cr", "auto", 0)
    nb.slots = nb.slots[:4]
    full = MeasuredView(Stats(measured=measured), nb, place=lambda: place, samples=lambda: 4000,
                        local_samples=lambda: 0, processes=8, tree_vector=lambda: None).section(256)
    assert len(full["compute"][0]["steps"]) == 256
    assert [x["peer"] for x in full["links"]] == ["0", "1", "2", "3"]
    assert not any(x["up"] for x in full["links"])
