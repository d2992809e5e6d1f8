"""Schedules without sockets: CodedReduce's UpStep and the ring's RingStep."""

from pathlib import Path

import numpy as np
import pytest

from crnet.coding.codes import code_for
from crnet.schemes.chunks import AUTO, ChunkLayout, chunk_bytes_for, largest_chunk
from crnet.schemes.coded_reduce.step import ResultStep, UpStep
from crnet.schemes.ring_allreduce.driver import RingStep

from ..helpers.vectors import gradients


def test_each_chunk_decodes_from_its_own_fastest_children():
    n, s, total = 4, 1, 14
    code = code_for(n, s)
    layout = ChunkLayout.of(total, np.float64, chunk_bytes=32)  # 4 elements per chunk: 4 chunks
    parts = gradients(0, n, total)  # g(P_j) per part
    messages = code.B @ parts
    buffers = [np.empty(total) for _ in range(n)]
    up = UpStep(7, layout, code, has_local=True, child_buffers=buffers)
    local = np.arange(total, dtype=np.float64)
    # A different quorum per chunk, and chunk 3 reusing chunk 0's.
    arrival = {0: [0, 1, 2], 1: [3, 2, 1], 2: [1, 3, 0], 3: [0, 1, 2]}
    ready = []
    for c, order in arrival.items():
        for k in order:
            a, b = layout.bounds(c)
            np.frombuffer(up.child_buffer(k, c), np.float64)[:] = messages[k, a:b]
            ready += up.child_arrived(k, c)
    assert ready == []  # nothing leaves before the local vector is in
    assert up.local_arrived(local) == [0, 1, 2, 3]
    out = np.concatenate([up.decode(c) for c in range(4)])
    np.testing.assert_allclose(out, local + parts.sum(axis=0), rtol=1e-12, atol=1e-12)
    assert up.complete


def test_frc_decodes_as_soon_as_every_group_has_a_child():
    # n = 6, s = 1: groups {0, 1}, {2, 3}, {4, 5}. Three children of different groups are
    # enough (n - s = 5 would wait for two of the three stragglers).
    code = code_for(6, 1)
    assert code.kind == "frc"
    layout = ChunkLayout.of(8, np.float64, chunk_bytes=64)   # one chunk
    parts = gradients(1, 6, 8)
    messages = code.B @ parts
    up = UpStep(3, layout, code, has_local=False, child_buffers=[None] * 6)
    up.silent.update({0: "frozen", 3: "frozen"})
    assert up.decodable                     # 1, 2, 4 or 5 may still cover every group
    ready = []
    for k in (5, 1, 2):
        np.frombuffer(up.child_buffer(k, 0), np.float64)[:] = messages[k]
        ready += up.child_arrived(k, 0)
        assert ready == ([0] if k == 2 else [])
    assert np.array_equal(up.decode(0), messages[[1, 2, 5]].sum(axis=0))
    np.testing.assert_allclose(up.output, parts.sum(axis=0), rtol=1e-12, atol=1e-12)
    assert up.complete and up.used == {1, 2, 5}
    up.silent[1] = "frozen"                 # nobody left of group {0, 1}
    assert not up.decodable


def test_leaf_message_is_its_local_vector_without_a_copy():
    layout = ChunkLayout.of(5, np.float32, chunk_bytes=8)
    up = UpStep(0, layout, None, has_local=True)
    local = np.ones(5, np.float32)
    assert up.local_arrived(local) == [0, 1, 2]
    assert np.shares_memory(up.decode(0), local)


def test_result_step_takes_each_chunk_once():
    layout = ChunkLayout.of(6, np.float64, chunk_bytes=16)
    r = ResultStep(3, layout)
    assert r.dest(1) is not None
    r.arrived(1)
    assert r.dest(1) is None and not r.complete
    for c in (0, 2):
        r.arrived(c)
    assert r.complete


def test_layout_check_explains_mismatches():
    layout = ChunkLayout.of(10, np.float32, chunk_bytes=16)
    assert layout.check(10, "float32", 2, 8) is None
    assert "12 x float32" in layout.check(12, "float32", 0, 16)
    assert "out of range" in layout.check(10, "float32", 3, 8)
    assert "has 4 bytes, expected 8" in layout.check(10, "float32", 2, 4)


@pytest.mark.parametrize("vector_bytes, chunk", [
    (4 << 10, 1 << 20), (16 << 20, 1 << 20), ((16 << 20) + 64, 2 << 20), (32 << 20, 2 << 20),
    (64 << 20, 4 << 20), (1 << 30, 4 << 20)])
def test_auto_chunks_grow_with_the_vector_from_1_to_4_mib(vector_bytes, chunk):
    assert chunk_bytes_for(vector_bytes) == chunk
    assert chunk_bytes_for(vector_bytes, 4096) == 4096          # a set size is kept
    layout = ChunkLayout.of(vector_bytes // 4, np.float32, AUTO)
    assert layout.chunk_elems * 4 == chunk
    assert layout.chunks == max(1, -(-vector_bytes // chunk))
    assert largest_chunk(AUTO) >= chunk and largest_chunk(4096) == 4096


@pytest.mark.parametrize("cuts", ["most", "mixed"])      # each rank's own cut (its link's)
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 16])    # one part per segment; many
@pytest.mark.parametrize("size", [2, 3, 5, 6])
@pytest.mark.parametrize("total", [1, 7, 100, 50_000])
def test_ring_allreduce_sums_exactly_with_the_master_as_a_member_adding_nothing(size, total,
                                                                                chunk_bytes, cuts):
    rng = np.random.default_rng(size * 1000 + total)
    workers = size - 1                      # ranks 0..size-2; the master is the last rank
    vectors = [rng.standard_normal(total) for _ in range(workers)]
    layout = ChunkLayout.of(total, np.float64, chunk_bytes)
    # "mixed": every rank cuts the segment it starts its own way (1, 2, ... parts, at most
    # the rule's), as ranks whose links differ do; each rank it passes keeps that cut.
    ranks = [RingStep(0, layout, k, size, parts=None if cuts == "most" else k + 1)
             for k in range(size)]
    if chunk_bytes < 1 << 20 and total // size >= 4:
        assert ranks[0].most_parts > 1     # the tree's chunk size caps a part
    # Deliver every send to the successor, in order, like one TCP link per rank.
    queues = [[] for _ in range(size)]
    order = rng.permutation(size)  # local vectors (the master's: none) arrive in any order
    for k in order:
        queues[(k + 1) % size] += ranks[k].local_arrived(vectors[k] if k < workers else None)
        progress = True
        while progress:
            progress = False
            for j in range(size):
                while queues[j]:
                    send = queues[j].pop(0)
                    assert ranks[j].check(send.phase, send.round, send.segment,
                                          send.payload.nbytes, send.part, send.parts) is None
                    dest = ranks[j].dest(send.phase, send.segment, send.part)
                    np.frombuffer(dest, np.float64)[:] = send.payload
                    queues[(j + 1) % size] += ranks[j].received(send.phase, send.round,
                                                                send.segment, send.part)
                    progress = True
    want = np.sum(vectors, axis=0)
    for r in ranks:
        assert r.complete
        np.testing.assert_allclose(r.result, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(r.result, ranks[-1].result)   # bit for bit the same


def test_a_segments_cut_is_its_first_senders_and_never_finer_than_the_rule():
    """A peer may cut the segment it starts in fewer parts than the rule (its link is fast),
    never more (every rank the segment passes would pay for its frames), and a segment's
    parts all have one cut."""
    layout = ChunkLayout.of(3 * 4, np.float64, chunk_bytes=8)   # the rule: 4 parts
    ring = RingStep(0, layout, rank=1, size=3)
    assert ring.most_parts == 4
    assert "cut in 5 parts, at most 4" in ring.check("rs", 0, 0, 8, 0, 5)
    assert ring.check("rs", 0, 0, 16, 1, 2) is None             # 2 parts of 2 elements
    assert "cut in 4 parts, earlier in 2" in ring.check("rs", 0, 0, 8, 0, 4)
    assert "part 2 out of range 0..1" in ring.check("rs", 0, 0, 16, 2, 2)
    assert ring.check("rs", 0, 0, 16, 0, 2) is None
    assert "earlier in 2" in ring.check("rs", 0, 0, 8, 0)       # no word: the rule's cut
    # ... the sender's own segment goes in its own cut, and comes back in it.
    mine = RingStep(0, layout, rank=1, size=3, parts=1)
    assert [(s.segment, s.part, s.parts, s.payload.size) for s in mine.local_arrived(np.ones(12))
            ] == [(1, 0, 1, 4)]
    assert "earlier in 1" in mine.check("ag", 0, 1, 8, 0, 4)
    assert RingStep(0, layout, rank=1, size=3, parts=9).parts == 4   # never above the rule


def test_a_ring_has_the_master_and_a_worker_at_least():
    with pytest.raises(ValueError, match="at least 2 members"):
        RingStep(0, ChunkLayout.of(9, np.float64, 1 << 20), rank=0, size=1)


def test_ring_rejects_a_wrong_segment():
    ring = RingStep(0, ChunkLayout.of(9, np.float64, 1 << 20), rank=1, size=3)
    assert "expected 0" in ring.check("rs", 0, 2, 24)
    assert "bad ring round" in ring.check("rs", 5, 0, 24)
    assert "part 1 out of range 0..0" in ring.check("rs", 0, 0, 24, 1)


def test_ring_forwards_each_part_as_soon_as_it_is_reduced():
    """Pipelined: part j of round r goes on while the round's later parts still arrive."""
    layout = ChunkLayout.of(3 * 4, np.float64, chunk_bytes=8)   # 4 one-element parts per segment
    ring = RingStep(0, layout, rank=1, size=3)
    assert ring.parts == 4
    first = ring.local_arrived(np.ones(12))
    assert [(s.phase, s.round, s.segment, s.part) for s in first] == [("rs", 0, 1, p) for p in range(4)]
    assert ring.check("rs", 0, 0, 8, 2) is None
    np.frombuffer(ring.dest("rs", 0, 2), np.float64)[:] = 5.0
    (send,) = ring.received("rs", 0, 0, 2)
    assert (send.round, send.segment, send.part) == (1, 0, 2)
    assert send.payload.tolist() == [6.0]


@pytest.mark.parametrize("total, size, parts", [
    (1_000_000, 20, 4),       # 4 MB in 200 kB segments: 4 parts of 50 kB
    (1_000, 20, 1),           # small vectors: latency-bound, one frame per segment
    (200_000, 2, 4),          # 400 kB segments: 100 kB parts
    (40_000, 2, 3),           # 80 kB segments: parts no smaller than 32 KiB
    (1_000_000, 21, 4),       # the bandwidth preset's ring (20 workers, the master): 47.6 kB
    (16 << 20, 20, 4),        # 64 MiB: 3.4 MB segments in 4 parts (under the 1 MiB chunk)
    (3, 20, 1),               # more ranks than elements: empty segments
])
def test_ring_parts_rule(total, size, parts):
    from crnet.schemes.ring_allreduce.driver import ring_parts

    assert ring_parts(ChunkLayout.of(total, np.float32, 1 << 20), size) == parts


@pytest.mark.parametrize("total, size, rate, parts", [
    (1 << 20, 4, None, 4),          # 4 MB on 4 hosts, no rate: 4 parts of 256 kB
    (1 << 20, 4, 125e6, 4),         # 1 Gbit/s: 125 kB parts would do; the rule's stand
    (1 << 20, 21, 125e6, 2),        # the large preset's ring at 1 Gbit/s: 200 kB segments
    (1 << 20, 21, 12.5e6, 4),       # ... at 100 Mbit/s (the bandwidth preset): as without
    (1 << 20, 4, 0.5e9, 3),         # 4 Gbit/s: 500 kB parts
    (1 << 20, 4, 8e9, 1),           # loopback: one part of the 1 MiB chunk
    (16 << 20, 4, 8e9, 4),          # 64 MB: the 4 MiB chunk still caps a part
])
def test_ring_parts_follow_the_link(total, size, rate, parts):
    """Where the link is fast, a part takes at least MIN_PART_SECONDS on it: fewer frames."""
    from crnet.schemes.chunks import AUTO
    from crnet.schemes.ring_allreduce.driver import ring_parts

    assert ring_parts(ChunkLayout.of(total, np.float32, AUTO), size, rate) == parts


def test_buffer_pool_reuses_only_unreferenced_arrays():
    from crnet.schemes.buffers import BufferPool

    pool = BufferPool(keep=2)
    a = pool.get(10, np.float32)
    b = pool.get(10, np.float32)
    assert a is not b
    a_id = id(a)
    del a
    c = pool.get(10, np.float32)
    assert id(c) == a_id  # idle again: reused, no new pages to fault in
    queued = memoryview(c[2:5]).cast("B")  # like a send still queued in the transport
    del c
    d = pool.get(10, np.float32)
    assert id(d) != a_id
    assert pool.get(10, np.float64).dtype == np.float64
    del queued


def test_a_childs_buffer_is_allocated_at_its_first_chunk():
    """A child that sends nothing (or a layout held apart until a quorum agrees on it)
    costs no vector: only the children that sent get a receive buffer."""
    code = code_for(3, 1)
    layout = ChunkLayout.of(10, np.float64, chunk_bytes=32)
    allocated = []

    def alloc(total, dtype):
        allocated.append((total, np.dtype(dtype)))
        return np.zeros(total, dtype)

    up = UpStep(1, layout, code, has_local=False, child_buffers=[None] * 3, alloc=alloc)
    assert allocated == []
    for c in range(layout.chunks):
        up.child_buffer(0, c)
    assert allocated == [(10, np.dtype(np.float64))]
    up.child_buffer(2, 0)
    assert len(allocated) == 2 and not up.decoded


def test_a_scheme_says_whether_its_sum_comes_over_peers_and_the_engine_asks_only_that():
    """The step engine's peer-scheme cases (a step cut off kept open, a parent back taking
    nothing up, a late child told the verdict) follow ``Scheme.SUMS_OVER_PEERS``: no scheme's
    name is tested in node/steps/."""
    import crnet.node.steps as steps_pkg
    from crnet.coding.plan import PEER_SCHEMES
    from crnet.schemes import DRIVERS, sums_over_peers

    assert {name for name in DRIVERS if sums_over_peers(name)} == set(PEER_SCHEMES) == {"rar", "spread"}
    folder = Path(steps_pkg.__file__).parent
    for path in folder.glob("*.py"):
        text = path.read_text()
        assert "PEER_SCHEMES" not in text, path
        for name in DRIVERS:
            assert f'"{name}"' not in text, (path, name)
