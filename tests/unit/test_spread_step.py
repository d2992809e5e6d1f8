"""spread's pure parts: who owns which chunks (owners.py), and one step at one host
(spread_step.py): the tree's recursion evaluated on arrivals, and the exact sum it decodes."""

import numpy as np
import pytest

from crnet.coding.plan import Tree, plan
from crnet.schemes.spread.owners import MIN_SHARE_BYTES, OwnerMap, owner_count, owners
from crnet.schemes.spread.step import Recursion, SpreadStep

from ..helpers.vectors import gradients


def test_small_vectors_have_one_owner_the_master_and_large_ones_every_host():
    assert owner_count(20_000, 21) == 1
    assert owner_count(4_000_000, 21) == 21
    assert owner_count(5 * MIN_SHARE_BYTES, 21) == 5
    small = owners(5000, "float32", 0, 21)
    assert small.ranks == (0,) and small.chunks_of(0) == range(small.layout.chunks)
    large = owners(1_000_000, "float32", 0, 21)
    assert large.ranks == tuple(range(21)) and large.layout.chunks == 21


@pytest.mark.parametrize("total, chunk_bytes, hosts", [
    (1_000_000, 0, 21), (1 << 16, 16 << 10, 7), (12345, 64, 5), (1 << 20, 1 << 20, 37)])
def test_every_chunk_has_one_owner_and_every_owner_a_fair_share(total, chunk_bytes, hosts):
    cut = owners(total, "float64", chunk_bytes, hosts)
    layout = cut.layout
    assert layout.chunk_elems * 8 <= max(8, chunk_bytes or 4 << 20)
    seen = []
    for rank in cut.ranks:
        chunks = cut.chunks_of(rank)
        assert all(cut.owner(c) == rank for c in chunks)
        seen += list(chunks)
        a, b = cut.elements_of(rank)
        assert (a, b) == (layout.bounds(chunks[0])[0], layout.bounds(chunks[-1])[1])
    assert seen == list(range(layout.chunks))
    counts = [len(cut.chunks_of(r)) for r in cut.ranks]
    assert max(counts) - min(counts) <= 1


def test_excluded_hosts_own_nothing_and_the_master_is_never_excluded():
    cut = owners(1_000_000, "float32", 0, 21, excluded={3, 7, 0})
    assert 0 in cut.ranks and 3 not in cut.ranks and 7 not in cut.ranks
    assert len(cut.ranks) == 19 and cut.chunks_of(3) == range(0)


def test_an_owner_map_holds_each_verdict_from_its_step_on():
    m = OwnerMap()
    assert m.excluded(5) == frozenset()
    m.replace(1, 10, {4})
    m.replace(2, 20, set())
    assert (m.excluded(9), m.excluded(10), m.excluded(19), m.excluded(20)) == (
        frozenset(), {4}, {4}, frozenset())
    assert m.latest == frozenset() and m.epoch == 2
    m.replace(3, 15, {5})   # a later verdict replaces what was said of the steps after it
    assert (m.excluded(12), m.excluded(15), m.excluded(30)) == ({4}, {5}, {5})


# ---------------------------------------------------------------- one step at one host

def local_vectors(tree: Tree, samples: int, dim: int, seed: int = 0):
    """Every worker's local weighted gradient (by rank) and the true sum, from per-sample
    vectors, with the allocation CodedReduce's tree uses."""
    grads = gradients(seed, samples, dim)
    p = plan(tree, samples)
    vecs = {}
    for rank, name in enumerate(tree.names()):
        if name:
            vecs[rank] = sum((w * grads[a:b].sum(axis=0) for a, b, w in p.nodes[name].local),
                             np.zeros(dim))
    return vecs, grads.sum(axis=0)


def master_step(tree: Tree, total: int):
    """Step 0 at the master, which owns every chunk of a small vector."""
    cut = owners(total, "float64", 0, tree.workers + 1)
    assert cut.ranks == (0,)
    return SpreadStep(0, cut, Recursion.of(tree, "auto"), 0)


def feed(st: SpreadStep, vecs: dict, ranks) -> list[int]:
    """The pieces of ``ranks`` arrive at the master: the chunks that decode."""
    ready = []
    for r in ranks:
        for c in st.owned:
            a, b = st.layout.bounds(c)
            dest = np.frombuffer(st.piece_dest(r, c), dtype=np.float64)
            dest[:] = vecs[r][a:b]
            if st.piece_arrived(r, c):
                ready.append(c)
    return ready


@pytest.mark.parametrize("tree", [Tree((4,), (1,)), Tree((2, 2), (1, 1)), Tree((3, 2), (1, 0)),
                                  Tree((5, 3), (4, 0))], ids=str)
def test_the_sum_is_exact_from_any_pieces_the_tree_would_decode_from(tree):
    dim = 64
    vecs, want = local_vectors(tree, 60, dim)
    rng = np.random.default_rng(1)
    for _ in range(5):
        st = master_step(tree, dim)
        order = list(vecs)
        rng.shuffle(order)
        ready = feed(st, vecs, order)
        assert ready == list(st.owned)      # each chunk decodes once, the moment it can
        for c in ready:
            st.decode(c)
        assert st.complete
        np.testing.assert_allclose(st.result, want, rtol=1e-9, atol=1e-9)


def test_a_chunk_decodes_without_up_to_s_children_of_every_parent_and_not_before():
    tree = Tree((3, 2), (1, 1))   # ranks: 1..3 layer 1; 4,5 under 1; 6,7 under 2; 8,9 under 3
    vecs, want = local_vectors(tree, 30, 8)
    st = master_step(tree, 8)
    # Without node 3 (and so its subtree), and one leaf of each of nodes 1 and 2:
    assert feed(st, vecs, [1, 2, 4]) == []
    assert feed(st, vecs, [6]) == [0]     # 1 (with 4) and 2 (with 6): 2 of the master's 3
    st.decode(0)
    np.testing.assert_allclose(st.result, want, rtol=1e-9)
    assert st.used == {1, 2, 4, 6}


def test_an_frc_parent_is_available_once_every_group_has_a_child():
    tree = Tree((4,), (1,))   # FRC at the master: groups {1, 2} and {3, 4} (ranks)
    vecs, want = local_vectors(tree, 40, 8)
    assert feed(master_step(tree, 8), vecs, [1, 2]) == []   # one group twice: not yet
    st = master_step(tree, 8)
    assert feed(st, vecs, [1]) == []
    assert feed(st, vecs, [4]) == [0]     # one of each group: exact, 2 of n - s = 3
    st.decode(0)
    np.testing.assert_allclose(st.result, want, rtol=1e-12)
    assert st.used == {1, 4}


def test_pieces_below_an_available_node_are_moot_each_told_once():
    tree = Tree((3, 2), (1, 1))   # ranks: 1..3 layer 1; 4,5 under 1; 6,7 under 2; 8,9 under 3
    vecs, _ = local_vectors(tree, 30, 8)
    st = master_step(tree, 8)
    feed(st, vecs, [4])
    assert st.moot(0) == []                    # node 1 waits for its own piece
    feed(st, vecs, [1])
    assert st.moot(0) == [5]                   # node 1 is available: its other child is moot
    feed(st, vecs, [2])
    assert st.moot(0) == []
    # Node 2 is available (with 7), and so is the master (2 of its 3 children): every piece
    # still out is moot, 5 not again.
    feed(st, vecs, [7])
    assert sorted(st.moot(0)) == [3, 6, 8, 9]
    assert st.moot(0) == []


def test_an_owner_is_never_told_its_own_piece_is_moot():
    tree = Tree((2, 2), (1, 1))   # ranks: 1, 2 layer 1; 3, 4 under 1; 5, 6 under 2
    cut = owners(1 << 16, "float64", 16 << 10, 7)
    owner = 4
    st = SpreadStep(0, cut, Recursion.of(tree, "auto"), owner)
    (c, *_) = st.owned
    for r in (1, 3):                           # node 1 with child 3; this host's own (4) not in
        st.piece_dest(r, c)
        st.piece_arrived(r, c)
    assert sorted(st.moot(c)) == [2, 5, 6]   # not 4: its piece is local, not sent


def test_an_inner_node_without_its_own_piece_counts_as_missing():
    tree = Tree((2, 2), (1, 0))
    vecs, _ = local_vectors(tree, 20, 4)
    st = master_step(tree, 4)
    # Node 1's children are both in, but not node 1's own piece; node 2 has nothing: the
    # master has none of its 2 children (it needs 1).
    assert feed(st, vecs, [3, 4, 5]) == []
    assert feed(st, vecs, [1]) == [0]


def test_what_a_step_waits_for_names_the_missing():
    tree = Tree((2, 2), (1, 0))
    st = SpreadStep(0, owners(1 << 16, "float64", 16 << 10, 7), Recursion.of(tree, "auto"), 3)
    assert "this host's training process's vector" in st.waiting_for()
    assert "owner rank(s) 0, 1, 2, 4, 5, 6" in st.waiting_for()


def test_a_relayed_chunk_of_the_sum_counts_only_once_it_matches_its_owners_digest():
    """Issue 39 row 3: a chunk a host other than its owner relayed waits for the owner's
    digest (SUM_DIGEST); one that does not match is dropped (its relay named), one that
    does counts, and a chunk from its owner needs none."""
    from crnet.schemes.spread.step import chunk_digest

    tree = Tree((3,), (1,))
    cut = owners(1 << 16, "float64", 0, 4)           # every host owns a share
    st = SpreadStep(0, cut, Recursion.of(tree, "auto"), 2)
    true = np.arange(1 << 16, dtype=np.float64)

    def arrive(chunk: int, values: np.ndarray, relayed_by: int | None) -> None:
        a, b = st.layout.bounds(chunk)
        np.frombuffer(st.sum_dest(chunk), dtype=np.float64)[:] = values[a:b]
        st.sum_arrived(chunk, relayed_by)

    theirs = [c for c in range(st.layout.chunks) if cut.owner(c) != 2]
    c0, c1 = cut.chunks_of(0)[0], cut.chunks_of(1)[0]
    arrive(c1, true, None)                              # from its owner, rank 1
    arrive(c0, np.full(1 << 16, 666.0), 1)              # relayed by rank 1: forged
    assert c0 in st.gathered and not st.complete
    assert st.verify(c0) is None                        # no digest yet: it waits
    a, b = st.layout.bounds(c0)
    st.digest_arrived(c0, chunk_digest(true[a:b]))
    assert st.verify(c0) == 1 and c0 not in st.gathered     # forged: not taken, the relay named
    arrive(c0, true, 1)                                 # relayed again, right this time
    assert st.verify(c0) is None and c0 in st.gathered and c0 not in st.unverified
    for c in theirs:
        if c not in st.gathered:
            arrive(c, true, None)
    assert len(st.gathered) == st.layout.chunks - len(st.owned)
