"""node/barriers.py without sockets: counts reported up, releases, and a process that
leaves while it waits (the handle ``arrive`` returns)."""

from crnet.messages import Barrier
from crnet.node.barriers import OPEN, Barriers
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


def test_a_barrier_is_its_key_and_its_count_so_a_squatter_opens_another_one():
    """Issue 26 row 7: a child's BARRIER("start", processes=2**20) before the real ones
    does not change how many the real barrier waits for."""
    b, _ = node("")
    released: list[int] = []
    b.from_child(0, Barrier("start", 1, 1 << 20))
    b.arrive("start", 2, lambda: released.append(0))
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
    b.arrive("start", 2, lambda: released.append(0))
    assert released == []
    attached[0] = 1                                  # its process did attach after all
    b.recount()
    assert released == [0]


def test_junk_barriers_drop_the_senders_own_counts_not_a_barrier_in_use():
    """Issue 26 row 7: a child that opens many barriers loses its own oldest counts; a
    barrier this host's processes wait at, and another child's count, stay."""
    b, _ = node("")
    released: list[str] = []
    b.arrive("start", 2, lambda: released.append("start"))
    b.from_child(1, Barrier("other", 2, 3))
    for i in range(OPEN + 10):
        b.from_child(0, Barrier(f"junk/{i}", 1, 3))
    b.from_child(1, Barrier("start", 1, 2))
    b.arrive("other", 3, lambda: released.append("other"))
    assert released == ["start", "other"]
