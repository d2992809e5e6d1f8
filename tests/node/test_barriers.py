"""node/barriers.py without sockets: counts reported up, releases, and a process that
leaves while it waits (the handle ``arrive`` returns)."""

import pytest

from crnet.coding.plan import Tree
from crnet.errors import ProtocolError
from crnet.node.collectives.barriers import OPEN, Barriers
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.protocol.messages import Barrier, vote_key
from crnet.schemes.base import Place

from ..helpers.fake_links import FakeLink

TREE = Tree((2, 2), (1, 1))


def node(name: str):
    """Barriers at ``name`` with a parent link (unless the master) and two children."""
    n = Neighbours()
    if name:
        n.parent = FakeLink("parent")
    n.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(2)]
    place = Place(name, TREE.layer(name), TREE, "cr", "auto", 32)
    return Barriers(n, lambda: place), n


def test_a_process_that_leaves_no_longer_counts_and_its_count_goes_up_again():
    b, n = node("0")
    released: list[str] = []
    leave = b.arrive("start", 3, lambda _: released.append("first"))
    b.arrive("start", 3, lambda _: released.append("second"))
    leave()
    leave()                                     # once only
    assert n.parent.messages() == [Barrier("start", 1, 3), Barrier("start", 2, 3),
                                   Barrier("start", 1, 3)]
    b.released(Barrier("start", 3, 3))         # the master let everyone go
    assert released == ["second"]
    assert [s.link.messages() for s in n.slots] == [[Barrier("start", 3, 3)]] * 2


def test_the_master_releases_once_all_are_there_and_leaving_after_that_changes_nothing():
    b, n = node("")
    released: list[int] = []
    leave = b.arrive("start", 2, lambda _: released.append(0))
    b.from_child(0, Barrier("start", 1, 2))
    assert released == [0]
    assert [s.link.messages() for s in n.slots] == [[Barrier("start", 2, 2)]] * 2
    leave()                                     # released: nothing to take back
    b.arrive("start", 2, lambda _: released.append(1))   # a new round of the same key
    assert released == [0]


def test_a_barrier_is_its_key_and_its_count_so_a_squatter_opens_another_one():
    """Issue 26 row 7: a child's BARRIER("start", processes=2**20) before the real ones
    does not change how many the real barrier waits for."""
    b, _ = node("")
    released: list[int] = []
    b.from_child(0, Barrier("start", 1, 1 << 20))
    b.arrive("start", 2, lambda _: released.append(0))
    b.from_child(1, Barrier("start", 1, 2))
    assert released == [0]


def test_a_childs_count_is_bounded_by_the_processes_attached_below_it():
    """Issue 26 row 7: a child with no process of the job below it counts for nothing."""
    attached = {0: 0, 1: 1}
    n = Neighbours()
    n.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(2)]
    place = Place("", 0, TREE, "cr", "auto", 32)
    b = Barriers(n, lambda: place, attached.__getitem__)
    released: list[int] = []
    b.from_child(0, Barrier("start", 1, 2))          # it claims one there; it has none
    b.arrive("start", 2, lambda _: released.append(0))
    assert released == []
    attached[0] = 1                                  # its process did attach after all
    b.recount()
    assert released == [0]


def test_junk_barriers_drop_the_senders_own_counts_not_a_barrier_in_use():
    """Issue 26 row 7: a child that opens many barriers loses its own oldest counts; a
    barrier this host's processes wait at, and another child's count, stay."""
    b, _ = node("")
    released: list[str] = []
    b.arrive("start", 2, lambda _: released.append("start"))
    b.from_child(1, Barrier("other", 2, 3))
    for i in range(OPEN + 10):
        b.from_child(0, Barrier(f"junk/{i}", 1, 3))
    b.from_child(1, Barrier("start", 1, 2))
    b.arrive("other", 3, lambda _: released.append("other"))
    assert released == ["start", "other"]


# ------------------------------------------------------------------ votes: root=True/False

def test_a_vote_reports_which_hosts_processes_arrived_as_the_root():
    """A node's count up names this host when its process arrived as the root, and what a
    child reported below it; the master's release names them, and every node remembers."""
    b, n = node("0")
    key = vote_key("params")
    b.from_child(1, Barrier(key, 1, 4, ("0.1",)))
    b.arrive(key, 4, lambda _: None)
    assert n.parent.messages() == [Barrier(key, 1, 4, ("0.1",)), Barrier(key, 2, 4, ("0.1",))]
    got: list = []
    b.arrive(key, 4, got.append, root=True)          # a second root, here
    assert n.parent.messages()[-1] == Barrier(key, 3, 4, ("0", "0.1"))
    b.released(Barrier(key, 4, 4, ("0.1",)))
    assert got == [("0.1",)] and b.decided(key, 4) == ("0.1",)
    assert [s.link.messages() for s in n.slots] == [[Barrier(key, 4, 4, ("0.1",))]] * 2


def test_the_master_names_every_root_at_the_vote_and_a_plain_barrier_none():
    b, n = node("")
    key = vote_key("params")
    got: list = []
    b.arrive(key, 3, got.append)
    b.from_child(0, Barrier(key, 1, 3, ("0",)))
    b.from_child(1, Barrier(key, 1, 3, ("1.0",)))
    assert got == [("0", "1.0")]
    assert [s.link.messages() for s in n.slots] == [[Barrier(key, 3, 3, ("0", "1.0"))]] * 2
    b.arrive("start", 1, got.append)
    assert got[-1] == () and [s.link.messages()[-1] for s in n.slots] == [
        Barrier("start", 1, 1)] * 2


def test_a_child_that_names_a_root_outside_its_subtree_is_a_protocol_error():
    """A child may say only that a host below it has the root: not its sibling, not the
    master."""
    b, _ = node("")
    key = vote_key("params")
    for root in ("1", "1.0", ""):
        with pytest.raises(ProtocolError, match="is not in the subtree of child 0"):
            b.from_child(0, Barrier(key, 1, 3, (root,)))
    b.from_child(0, Barrier("start", 1, 3, ("1",)))   # not a vote: what it names is moot


def test_a_vote_released_at_the_master_is_remembered_until_a_new_job():
    b, _ = node("")
    key = vote_key("k")
    got: list = []
    b.arrive(key, 2, lambda _: None, root=True)       # the root's daemon keeps no handle
    b.arrive(key, 2, got.append)
    assert got == [("",)] and b.decided(key, 2) == ("",)
    b.new_job()
    assert b.decided(key, 2) is None
