"""Shared memory between a training process and its daemon: one file, two mappings, two halves."""

import os

import numpy as np
import pytest

from crnet.shm import PROGRESS_BYTES, SharedRegion


@pytest.fixture
def regions():
    """A client's region and the daemon's mapping of it; the name is removed at teardown."""
    client = SharedRegion.create(64)
    daemon = SharedRegion.attach(client.path, 64)
    yield client, daemon
    client.unlink()


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


def test_only_the_creator_owns_the_name():
    client = SharedRegion.create(16)
    path = client.path
    try:
        daemon = SharedRegion.attach(path, 16)
        assert os.stat(path).st_size == PROGRESS_BYTES + 32
        assert daemon.path is None
        daemon.unlink()  # the daemon's side has no name to remove
        assert os.path.exists(path)
    finally:
        client.unlink()


def test_the_mappings_outlive_the_name(regions):
    client, daemon = regions
    path = client.path
    client.unlink()
    assert not os.path.exists(path)
    assert client.path is None
    client.unlink()  # a second unlink is harmless
    client.input(np.int64, 8)[:] = 7
    daemon.output(np.int64, 8)[:] = 9
    np.testing.assert_array_equal(daemon.input(np.int64, 8), np.full(8, 7))
    np.testing.assert_array_equal(client.output(np.int64, 8), np.full(8, 9))


def test_attach_with_the_wrong_capacity_is_refused(regions):
    client, _ = regions
    with pytest.raises(ValueError, match=f"{client.path} has {PROGRESS_BYTES + 128} bytes, "
                                         f"expected {PROGRESS_BYTES + 256}"):
        SharedRegion.attach(client.path, 128)


def test_attach_to_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        SharedRegion.attach(str(tmp_path / "gone"), 16)


@pytest.mark.parametrize("half", ["input", "output"])
def test_a_vector_bigger_than_a_half_is_refused(regions, half):
    client, _ = regions
    assert getattr(client, half)(np.float64, 8).nbytes == 64  # exactly a half fits
    with pytest.raises(ValueError, match="9 x float64 does not fit in 64 bytes"):
        getattr(client, half)(np.float64, 9)


def test_a_region_has_at_least_one_byte_per_half():
    r = SharedRegion.create(0)
    try:
        assert r.capacity == 1
        assert os.stat(r.path).st_size == PROGRESS_BYTES + 2
    finally:
        r.unlink()


def test_progress_is_seen_by_the_process_as_the_daemon_writes_it():
    client = SharedRegion.create(16)
    try:
        daemon = SharedRegion.attach(client.path, 16)
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
        client.unlink()
