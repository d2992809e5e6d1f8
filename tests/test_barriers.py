"""node/barriers.py without sockets: counts reported up, releases, and a process that
leaves while it waits (the handle ``arrive`` returns)."""

from crnet.messages import Barrier
from crnet.node.barriers import Barriers
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.plan import Tree
from crnet.schemes.base import Place

from .fake_links import FakeLink

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
    leave = b.arrive("start", 3, lambda: released.append("first"))
    b.arrive("start", 3, lambda: released.append("second"))
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
    leave = b.arrive("start", 2, lambda: released.append(0))
    b.from_child(0, Barrier("start", 1, 2))
    assert released == [0]
    assert [s.link.messages() for s in n.slots] == [[Barrier("start", 2, 2)]] * 2
    leave()                                     # released: nothing to take back
    b.arrive("start", 2, lambda: released.append(1))   # a new round of the same key
    assert released == [0]
