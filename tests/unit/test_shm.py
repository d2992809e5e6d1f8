"""Shared memory between a training process and its daemon: one sealed memfd, two mappings."""

import os

import numpy as np
import pytest

from crnet.protocol.shm import PROGRESS_BYTES, SharedRegion


def handed_over(client: SharedRegion, capacity: int) -> SharedRegion:
    """What the daemon maps: its own descriptor of the client's memory (SCM_RIGHTS in life)."""
    return SharedRegion.attach(os.dup(client.fd), capacity)


@pytest.fixture
def regions():
    """A client's region and the daemon's mapping of it."""
    client = SharedRegion.create(64)
    daemon = handed_over(client, 64)
    client.close_fd()
    return client, daemon


def test_the_input_half_is_shared_from_client_to_daemon(regions):
    client, daemon = regions
    client.input(np.float64, 8)[:] = np.arange(8)
    np.testing.assert_array_equal(daemon.input(np.float64, 8), np.arange(8))


def test_the_output_half_is_shared_from_daemon_to_client(regions):
    client, daemon = regions
    daemon.output(np.float32, 16)[:] = -1.5
    np.testing.assert_array_equal(client.output(np.float32, 16), np.full(16, -1.5, np.float32))


def test_the_halves_do_not_overlap(regions):
    client, daemon = regions
    client.input(np.uint8, 64)[:] = 1
    daemon.output(np.uint8, 64)[:] = 2
    assert set(client.input(np.uint8, 64)) == {1}
    assert set(client.output(np.uint8, 64)) == {2}


def test_the_memory_has_no_name_and_cannot_be_resized():
    """Sealed: a client that shrinks the memory under the daemon's mapping would kill the
    daemon with SIGBUS; the kernel refuses."""
    client = SharedRegion.create(16)
    try:
        assert os.fstat(client.fd).st_size == PROGRESS_BYTES + 32
        assert os.readlink(f"/proc/self/fd/{client.fd}").startswith("/memfd:crnet-shm")
        for size in (16, PROGRESS_BYTES + 64):
            with pytest.raises(PermissionError):
                os.ftruncate(client.fd, size)
    finally:
        client.close_fd()
        client.close_fd()          # a second close is harmless


def test_attach_with_the_wrong_capacity_is_refused():
    client = SharedRegion.create(128)
    with pytest.raises(ValueError, match=f"has {PROGRESS_BYTES + 256} bytes, expected "
                                         f"{PROGRESS_BYTES + 512}"):
        handed_over(client, 256)
    client.close_fd()


def test_attach_refuses_a_file_or_unsealed_memory(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"\0" * (PROGRESS_BYTES + 32))
    fd = os.open(path, os.O_RDWR)
    with pytest.raises(ValueError, match="not sealable shared memory"):
        SharedRegion.attach(fd, 16)                  # and it closed the descriptor
    with pytest.raises(OSError):
        os.fstat(fd)
    fd = os.memfd_create("loose", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, PROGRESS_BYTES + 32)
    with pytest.raises(ValueError, match="not sealed against shrinking and growing"):
        SharedRegion.attach(fd, 16)


@pytest.mark.parametrize("half", ["input", "output"])
def test_a_vector_bigger_than_a_half_is_refused(regions, half):
    client, _ = regions
    assert getattr(client, half)(np.float64, 8).nbytes == 64  # exactly a half fits
    with pytest.raises(ValueError, match="9 x float64 does not fit in 64 bytes"):
        getattr(client, half)(np.float64, 9)


def test_a_region_has_at_least_one_byte_per_half():
    r = SharedRegion.create(0)
    assert r.capacity == 1 and os.fstat(r.fd).st_size == PROGRESS_BYTES + 2
    r.close_fd()


def test_progress_is_seen_by_the_process_as_the_daemon_writes_it():
    client = SharedRegion.create(16)
    try:
        daemon = handed_over(client, 16)
        written, read = daemon.progress, client.progress
        written.reset()
        assert read.tree_step == -1 and not read.finished(0)
        written.decided(0, tree_step=0, newest=0)
        written.decided(2, tree_step=0, newest=2)    # decided here only: not the tree's step
        assert read.tree_step == 0 and read.finished(0) and read.finished(2)
        assert not read.finished(1)                   # still open, though a later one is done
        written.decided(None, tree_step=5, newest=2)  # news of the tree, no decision here
        assert read.tree_step == 5
        written.decided(100, tree_step=100, newest=100)
        assert read.finished(30)                      # too far behind to matter: done
        assert not read.finished(101)
    finally:
        client.close_fd()
