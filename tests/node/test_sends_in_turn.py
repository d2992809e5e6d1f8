"""Sends in turn (``Neighbours.in_turn``, spread's pieces and sums): one peer link at a time
takes the host's uplink, kept sends outlive their step, a send withdrawn before its turn
never goes, and a peer whose link is cut (``peers/liveness.py`` found it frozen) holds no
send behind it. Over stand-in links: no sockets."""

import pytest

from crnet.node.neighbours import Neighbours

pytestmark = pytest.mark.timeout(10)


class PacedLink:
    """A peer link whose kernel takes nothing until the test says so (``drain``)."""

    def __init__(self, name: str):
        self.name = name
        self.frames: list = []
        self.write_buffer_size = 0
        self.bytes_out = 0
        self.is_closing = False
        self.on_drained = None
        self.paced = None
        self.aborted: str | None = None

    def pace(self, unsent: int) -> None:
        self.paced = unsent

    def write(self, frame: list) -> bool:
        if self.is_closing:
            return False
        self.frames.append(frame)
        size = sum(map(len, frame))
        self.write_buffer_size += size
        self.bytes_out += size
        return True

    def drain(self, nbytes: int | None = None) -> None:
        """The kernel takes ``nbytes`` (all) of what waits; the protocol hears when all did."""
        self.write_buffer_size -= self.write_buffer_size if nbytes is None else nbytes
        if not self.write_buffer_size and self.on_drained is not None:
            self.on_drained()

    def abort(self, reason: str) -> None:
        self.aborted, self.is_closing = reason, True


def mesh(ranks=(1, 2, 3)):
    nb = Neighbours()
    links = {r: PacedLink(f"peer {r}") for r in ranks}
    for r, link in links.items():
        nb.peer_up(r, link)   # type: ignore[arg-type]
    return nb, links


def frame(tag: str) -> list:
    return [tag.encode()]


async def test_one_peer_link_writes_at_a_time_in_the_order_given():
    nb, links = mesh()
    nb.in_turn(1, 0, frame("a"))
    nb.in_turn(2, 0, frame("b"))
    nb.in_turn(3, 0, frame("c"))
    assert [len(link.frames) for link in links.values()] == [1, 0, 0]
    assert links[1].paced is not None   # paced before its first write
    links[1].drain()
    assert [len(link.frames) for link in links.values()] == [1, 1, 0]
    links[2].drain()
    links[3].drain()
    assert [link.frames for link in links.values()] == [[frame("a")], [frame("b")], [frame("c")]]


async def test_a_decided_step_drops_its_pieces_but_not_the_sends_it_keeps():
    nb, links = mesh()
    nb.in_turn(1, 5, frame("first"))
    nb.in_turn(2, 5, frame("piece"))
    nb.in_turn(3, 5, frame("sum"), keep=True)
    nb.in_turn(2, 6, frame("next"))
    nb.forget(5)
    links[1].drain()
    assert links[2].frames == []              # step 5's piece for it is moot
    assert links[3].frames == [frame("sum")]  # the sum goes: the others still need it
    links[3].drain()
    assert links[2].frames == [frame("next")]


async def test_a_send_withdrawn_before_its_turn_never_goes():
    nb, links = mesh()
    nb.in_turn(1, 5, frame("first"), tag=0)
    nb.in_turn(2, 5, frame("moot"), tag=3)
    nb.in_turn(2, 5, frame("needed"), tag=4)
    assert not nb.withdraw(1, 5, 0)          # it went to its link already
    assert not nb.withdraw(2, 6, 3)          # another step's
    assert nb.withdraw(2, 5, 3)
    links[1].drain()
    assert links[2].frames == [frame("needed")]


async def test_a_peer_cut_off_as_frozen_holds_no_send_behind_it():
    nb, links = mesh()
    nb.in_turn(1, 0, frame("to a frozen peer"))
    nb.in_turn(2, 0, frame("to a live one"))
    assert links[2].frames == []          # its turn waits for peer 1's link
    links[1].abort("nothing came from it (frozen?)")   # what liveness.py does
    nb.peer_down(1)                       # ... and what its link going tells the mesh
    assert links[2].frames == [frame("to a live one")]


async def test_a_slow_peer_keeps_its_turn_until_its_kernel_took_every_byte():
    nb, links = mesh()
    nb.in_turn(1, 0, [b"x" * 100])
    nb.in_turn(2, 0, frame("behind it"))
    for _ in range(4):
        links[1].drain(10)        # a little each time: slow, not frozen
    assert links[1].aborted is None and links[2].frames == []
    links[1].drain()
    assert links[2].frames == [frame("behind it")]
