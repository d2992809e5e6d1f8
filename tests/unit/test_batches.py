"""BatchSampler: hosts agree on every step's batch without talking; epochs are permutations."""

import numpy as np
import pytest

from crnet.client import Assignment
from crnet.client.batches import BatchSampler
from crnet.coding.plan import Tree, plan


def test_every_epoch_visits_every_sample_once():
    s = BatchSampler(dataset_size=10, batch_size=4, seed=3)
    seen = np.concatenate([s.indices(t) for t in range(5)])  # 20 positions = 2 epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert not np.array_equal(seen[:10], seen[10:])  # a fresh permutation each epoch


def test_hosts_agree_and_local_shares_cover_the_batch_with_plan_weights():
    m, step = 60, 7
    p = plan(Tree.regular(3, 2, 1), m)
    sampler = BatchSampler(dataset_size=1000, batch_size=m, seed=1)
    again = BatchSampler(dataset_size=1000, batch_size=m, seed=1)
    np.testing.assert_array_equal(sampler.indices(step), again.indices(step))
    batch = sampler.indices(step)
    for a in p.nodes.values():
        asg = Assignment(a.name, a.layer, m, p.workers, a.local)
        idx, w = sampler.local(step, asg)
        pos, w2 = asg.positions()
        np.testing.assert_array_equal(idx, batch[pos])
        np.testing.assert_array_equal(w, w2)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="must be >= 1"):
        BatchSampler(0, 5)
