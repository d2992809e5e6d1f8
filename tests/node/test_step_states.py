"""A step at one node is one record with one state (``crnet/node/steps/record.py``): the
table of its moves walked whole (every state, every event, the illegal ones refused), and
the engine taking a step through each state on the paths that lead there: a step begun by
children, its clock, its deadline and grace, a failure here and its reopening, a step
kept open for its peers' sum, and one prune for whole records."""

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.node.steps.record import MOVES, Event, IllegalMove, StepRecord, StepState, StepTable
from crnet.protocol.messages import Open
from crnet.schemes import Place

from ..helpers.engines import PAIR, master, node, recorder, send_chunk, send_result
from ..helpers.fake_links import FakeLink
from ..helpers.waits import wait_until

pytestmark = pytest.mark.timeout(30)

S, E = StepState, Event
OPEN = {S.WAITING, S.RUNNING, S.OVERDUE, S.PAUSED}


# ---------------------------------------------------------------- the table

@pytest.mark.parametrize("state", list(StepState))
@pytest.mark.parametrize("event", list(Event))
def test_every_state_takes_exactly_the_events_of_its_row(state, event):
    record = StepRecord(7, state)
    after = MOVES[state].get(event)
    if after is None:
        with pytest.raises(IllegalMove, match=f"step 7: {event.value} while {state.value}"):
            record.move(event)
        assert record.state is state          # refused: nothing moved
    else:
        assert record.move(event) is after and record.state is after


def test_the_table_covers_every_state_and_every_event():
    assert set(MOVES) == set(StepState)
    reachable, todo = {S.NEW}, [S.NEW]
    while todo:
        for after in MOVES[todo.pop()].values():
            if after not in reachable:
                reachable.add(after)
                todo.append(after)
    assert reachable == set(StepState)        # every state is on some path from NEW
    assert {e for row in MOVES.values() for e in row} == set(Event)
    assert MOVES[S.DECIDED] == {}             # the tree's word is final
    assert {s for s in StepState if s.is_open} == OPEN
    assert {s for s in StepState if s.is_decided} == {S.FAILED_HERE, S.DECIDED}
    for state in OPEN:                         # an open step can always be decided, or fail here
        assert MOVES[state][E.DECIDE] is S.DECIDED and MOVES[state][E.FAIL_HERE] is S.FAILED_HERE
    assert MOVES[S.FAILED_HERE] == {E.REOPEN: S.NEW}   # the tree's verdict reopens it first


def test_docs_development_md_tabulates_exactly_these_moves():
    text = (Path(__file__).resolve().parents[2] / "docs" / "development.md").read_text()
    documented = {}
    for name, cell in re.findall(r"^\| ([A-Z_]+) \| [^|]+ \| ([^|]+) \|$", text, re.M):
        moves = {}
        for part in filter(None, (p.strip() for p in cell.strip().split(";"))):
            if part == "none":
                continue
            event, after = part.rsplit(":", 1)
            moves[Event(re.sub(r" \(.*\)$", "", event))] = StepState[after.strip()]
        documented[StepState[name]] = moves
    assert documented == MOVES


def test_a_reopened_record_forgets_its_failure_and_keeps_the_masters_word():
    record = StepRecord(3, S.FAILED_HERE, failure="cut off", settled=True)
    record.move(E.REOPEN)
    assert record.state is S.NEW and record.failure is None and record.settled


def test_one_prune_drops_whole_records():
    table = StepTable()
    for step in range(6):
        table.make(step).waiters.append(print)
    table.make(2).state = S.DECIDED
    table.drop_through(3)
    assert [r.step for r in table] == [4, 5] and table.state(2) is S.NEW
    assert table.make(4) is table.get(4)      # one record per step


# ---------------------------------------------------------------- the engine's paths

def state(engine, step):
    return engine.window.steps.state(step)


async def test_a_step_waits_for_its_vouchers_then_runs_then_is_decided(engine_at):
    """At a master with two children (s = 1), one child's chunk begins a step (WAITING: one
    child may be straggling); the second child's OPEN starts its clock (RUNNING); a decode
    decides it (DECIDED); the record goes with the window."""
    engine = engine_at(master(PAIR), [FakeLink(), FakeLink()], window=2, keep_results=2)
    assert state(engine, 0) is S.NEW
    engine.child_opened(0, Open(0))
    assert state(engine, 0) is S.WAITING and engine.open_steps == [0]
    engine.child_opened(1, Open(0))
    assert state(engine, 0) is S.RUNNING
    assert send_chunk(engine, 0, 0, 0, np.ones(2))          # either child decodes it
    assert state(engine, 0) is S.DECIDED and engine.is_decided(0)
    for step in range(1, 4):
        engine.request(step, None, recorder())
        assert state(engine, step) is S.RUNNING
        assert send_chunk(engine, 1, step, 0, np.ones(2))
    assert engine.window.steps.decided_steps() == [2, 3]     # 0 and 1 are behind the window
    assert engine.is_decided(0) and state(engine, 0) is S.NEW   # (no record: decided as behind)


async def test_a_nodes_step_runs_over_its_deadline_then_fails_here_after_the_grace(engine_at):
    loop = asyncio.get_running_loop()
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent, timeout=0.05)
    answer = recorder(loop)
    engine.request(2, np.ones(4), answer)
    assert state(engine, 2) is S.RUNNING
    await wait_until(lambda: state(engine, 2) is S.OVERDUE, "the deadline", timeout=2)
    assert answer.got == [] and engine.open_steps == [2]    # the master may still decide
    await answer.future
    assert state(engine, 2) is S.FAILED_HERE and engine.failed_here(2)
    assert not answer.got[0].tree_wide and engine.outcome(2) == answer.got[0]
    # asked again: reopened (as if it had not begun here), and it runs anew
    again = recorder()
    engine.request(2, np.ones(4), again)
    assert state(engine, 2) is S.RUNNING and not engine.is_decided(2)
    send_result(engine, 2, np.arange(4.0))
    assert state(engine, 2) is S.DECIDED and len(again.got) == 1
    np.testing.assert_array_equal(again.got[0].vector, np.arange(4.0))


async def test_the_masters_verdict_reopens_a_failure_here_and_decides_it(engine_at):
    engine = engine_at(node("0"), [FakeLink() for _ in range(3)], None)
    engine.decisions.fail(4, "node 0 has no parent", tree_wide=False)
    assert state(engine, 4) is S.FAILED_HERE
    with pytest.raises(IllegalMove):          # a failure here is decided: it must be reopened
        engine.window.steps.get(4).move(E.DECIDE)
    engine.neighbours.parent = FakeLink("parent")
    send_result(engine, 4, np.arange(8.0))
    assert state(engine, 4) is S.DECIDED and not engine.failed_here(4)


async def test_a_step_that_sums_over_peers_is_paused_not_failed_when_cut_off(engine_at):
    """spread: cut off from the master, a host's step answers its process (failed here) and
    stays open, its clock stopped, for the sum and the master's word (PAUSED); the process
    asking again starts its clock (RUNNING). The master's word (SETTLED) is the record's:
    it stands whatever the scheme does with its own state of the step."""
    tree = Tree((3,), (1,))
    place = Place("1", 1, tree, "spread", "auto", 32)
    engine = engine_at(place, [], FakeLink("parent"))
    first = recorder()
    engine.request(5, np.ones(8), first)
    assert state(engine, 5) is S.RUNNING
    engine.decisions.settle(5)
    engine.neighbours.parent = None
    engine.parent_lost("lost the connection to its parent")
    assert [type(o).__name__ for o in first.got] == ["Failed"] and not first.got[0].tree_wide
    assert state(engine, 5) is S.PAUSED and engine.open_steps == [5] and not engine.is_decided(5)
    engine.scheme.steps.pop(5)                 # the scheme begins the step again, say
    assert engine.decisions.is_settled(5)
    again = recorder()
    engine.request(5, None, again)
    assert state(engine, 5) is S.RUNNING and again.got == []
