"""State requests survive the links they travel on (``node/collectives/state_requests.py``).

No sockets: a node's StateRequests over Neighbours with recording links. A request passed
up goes up again on a new parent link, until an answer comes down; a child's request is
held until the job's counts say the child has processes; at the master, a child slot whose
every process asks answers nothing, so the only other slot's copy needs no second.
"""

from __future__ import annotations

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.node.collectives.state_answers import Answer, digest_of
from crnet.node.collectives.state_requests import PASSED_UP, StateRequests
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.protocol.messages import WantState
from crnet.schemes import Place

from ..helpers.fake_links import FakeLink

pytestmark = pytest.mark.timeout(10)

TREE = Tree.regular(2, 2, 1)


def place(name):
    return Place(name, TREE.layer(name), TREE, "cr", "auto", 32)


def requests_at(name, below=None):
    """StateRequests at node ``name`` with two children; ``below``: child slot -> processes."""
    nb = Neighbours()
    nb.parent = None if name == "" else FakeLink("parent")
    nb.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(2)]
    counts = {} if below is None else below
    given: list[Answer] = []
    sr = StateRequests(nb, lambda: place(name), given.append,
                       attached_below=lambda k: counts.get(k, 0), window=2.0)
    return sr, nb, counts, given


def wanted(link):
    return [m.nonce for m, _ in link.sent if isinstance(m, WantState)]


async def test_a_request_passed_up_goes_up_again_on_a_new_parent_link():
    sr, nb, _, _ = requests_at("0", {0: 1})
    sr.want_state(11, child=0)
    sr.want_state(12, asker=object())
    assert wanted(nb.parent) == [11, 12]
    nb.parent = new = FakeLink("parent, again")     # the parent (or the master) restarted
    sr.parent_up()
    assert wanted(new) == [11, 12]
    sr.answered()                                    # a state came down: it serves them all
    nb.parent = newer = FakeLink("parent, once more")
    sr.parent_up()
    assert wanted(newer) == []


async def test_only_the_newest_requests_are_kept_to_pass_up_again():
    sr, nb, _, _ = requests_at("0", {0: 1})
    for nonce in range(1, PASSED_UP + 5):
        sr.want_state(nonce, child=0)
    nb.parent = new = FakeLink("parent, again")
    sr.parent_up()
    assert wanted(new) == list(range(5, PASSED_UP + 5))


async def test_a_childs_request_waits_until_its_processes_are_counted():
    """A child that rejoined asks before its JOB report says it has processes: held."""
    sr, nb, counts, _ = requests_at("0")
    sr.want_state(21, child=1)
    assert wanted(nb.parent) == []
    sr.counts_changed()
    assert wanted(nb.parent) == []
    counts[1] = 1
    sr.counts_changed()
    assert wanted(nb.parent) == [21]
    sr.counts_changed()                              # once
    assert wanted(nb.parent) == [21]


async def test_a_slot_whose_every_process_asks_leaves_the_other_slots_copy_alone():
    """The master: slot 0's one process asks, so slot 1's copy is the only one to come; it
    is taken at once, not after the window."""
    sr, _, _, given = requests_at("", {0: 1, 1: 2})
    sr.want_state(31, child=0)
    key = "state/31"
    vector = np.arange(3.0)
    digest = digest_of(7, vector.dtype, vector.size)
    digest.update(vector.tobytes())
    answer = Answer((key, "1.0"), "1.0", 7, vector)
    sr.copy(key, 1, digest.digest(), answer)
    assert given == [answer]


async def test_a_lone_copy_waits_while_another_slot_may_answer():
    sr, _, _, given = requests_at("", {0: 2, 1: 2})
    sr.want_state(41, child=0)                       # one of slot 0's two processes asks
    key = "state/41"
    vector = np.arange(3.0)
    digest = digest_of(7, vector.dtype, vector.size)
    digest.update(vector.tobytes())
    sr.copy(key, 1, digest.digest(), Answer((key, "1.0"), "1.0", 7, vector))
    assert given == []
    sr.clear()
