"""crnet.torch on real daemons: every replica trains exactly like one process on the global batch.

Each host's training process is a thread with the blocking Client (as in test_loop.py),
training a small MLP on random data with ``DistributedOptimizer``; the reference is one
process training the same model on the same global batches with a mean loss.
"""

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from crnet import BatchSampler, Client, DaemonBusy, StepLost  # noqa: E402
from crnet.coding.plan import Tree  # noqa: E402
from crnet.torch import (  # noqa: E402
    CodedSampler,
    DistributedOptimizer,
    allreduce,
    broadcast_optimizer_state,
    broadcast_parameters,
    result,
    weighted_loss,
)
from crnet.torch.replica_state import ReplicaState  # noqa: E402

from ..helpers.vectors import rel_error  # noqa: E402

pytestmark = pytest.mark.timeout(180)

DATASET = 150           # not a multiple of the batch: batches straddle epochs
FEATURES, HIDDEN, OUTPUTS = 5, 8, 3
SAMPLER_SEED = 7
SMALL = Tree.regular(2, 2, 1)     # 7 hosts, fractional repetition (0/1 weights)
CODED = Tree.regular(3, 2, 1)     # 13 hosts, cyclic repetition (real weights, negative ones too)

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.2),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.02),
}


def data(dtype):
    rng = np.random.default_rng(42)
    x = rng.standard_normal((DATASET, FEATURES))
    y = np.tanh(x @ rng.standard_normal((FEATURES, OUTPUTS))) + 0.1 * rng.standard_normal((DATASET, OUTPUTS))
    return torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


def make_model(dtype, seed=0):
    """The same initial parameters for the same seed, without torch's global generator
    (the threads share it)."""
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, OUTPUTS)).to(dtype)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(0.5 * rng.standard_normal(tuple(p.shape))))
    return model


def per_sample_loss(model, x, y):
    return ((model(x) - y) ** 2).mean(dim=1)      # reduction="none", one number per sample


def reference(dtype, optimizer, steps, m, skipped=()):
    """One process, the whole global batch each step, the mean loss (no update in the
    ``skipped`` steps)."""
    x, y = data(dtype)
    model = make_model(dtype)
    opt = OPTIMIZERS[optimizer](model.parameters())
    batches = BatchSampler(DATASET, m, SAMPLER_SEED)
    for t in range(steps):
        if t in skipped:
            continue
        idx = torch.from_numpy(batches.indices(t))
        opt.zero_grad()
        per_sample_loss(model, x[idx], y[idx]).mean().backward()
        opt.step()
    return model, opt


class Trainer:
    """One host's training process: the docs' loop, with optional straggling."""

    def __init__(self, lt, name, dtype, optimizer, slow_p=0.0, slow_s=0.0, micro=4, seed=0):
        self.lt, self.name, self.dtype, self.optimizer = lt, name, dtype, optimizer
        self.slow_p, self.slow_s, self.micro = slow_p, slow_s, micro
        self.rng = np.random.default_rng(sum(map(ord, name)))
        self.seed = seed
        self.x, self.y = data(dtype)
        self.error: BaseException | None = None
        self.opts: list = []          # every DistributedOptimizer it had (a restart adds one)

    def connect(self):
        deadline = time.monotonic() + 20
        while True:
            try:
                return Client(self.lt.socket_path(self.name), timeout=60)
            except DaemonBusy:        # the daemon has not yet seen the old process go
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def start(self, seed=None):
        """A new process: its own model (from ``seed``) and optimizer."""
        self.client = self.connect()
        self.model = make_model(self.dtype, self.seed if seed is None else seed)
        self.opt = DistributedOptimizer(OPTIMIZERS[self.optimizer](self.model.parameters()),
                                        self.model, self.client)
        self.opts.append(self.opt)
        self.sampler = CodedSampler(DATASET, self.client, seed=SAMPLER_SEED)

    def train(self, until):
        opt = self.opt
        while opt.step_index < until:
            indices, weights = self.sampler.local(opt.step_index)
            opt.zero_grad()
            slow = self.rng.random() < self.slow_p
            for idx, w in opt.micro_batches(indices, weights, size=self.micro):
                if slow:
                    time.sleep(self.slow_s)                 # a straggling micro-batch
                weighted_loss(per_sample_loss(self.model, self.x[idx], self.y[idx]), w).backward()
            opt.step()

    def run(self, steps, everyone, body=None):
        try:
            self.start()
            everyone.wait(60)         # the job starts when all its processes are there
            if body is None:
                self.train(steps)
            else:
                body(self)
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            self.error = e
            everyone.abort()
        finally:
            if getattr(self, "client", None) is not None:
                self.client.close()


def run_trainers(trainers, steps, body=None):
    everyone = threading.Barrier(len(trainers))
    threads = [threading.Thread(target=t.run, args=(steps, everyone, body)) for t in trainers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    errors = [f"{t.name or 'master'}: {t.error!r}" for t in trainers if t.error is not None]
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return trainers


def state_tensors(opt):
    """Every tensor of an optimizer's state, in order (the step counters too)."""
    out = []
    for p in (p for g in opt.param_groups for p in g["params"]):
        for key, v in sorted(opt.state.get(p, {}).items()):
            out.append((key, v if isinstance(v, torch.Tensor) else torch.tensor(v)))
    return out


def assert_replicas_equal_reference(trainers, dtype, optimizer, steps, m, tol, skipped=()):
    ref_model, ref_opt = reference(dtype, optimizer, steps, m, skipped)
    want = [p.detach() for p in ref_model.parameters()]
    first = trainers[0]
    for t in trainers:
        assert t.opt.step_index == steps, t.name
        got = [p.detach() for p in t.model.parameters()]
        for g, w in zip(got, want):
            assert rel_error(g.double().numpy(), w.double().numpy()) <= tol, (t.name, rel_error(
                g.double().numpy(), w.double().numpy()))
        # Every replica applied the very same vectors: identical to the bit.
        for g, f in zip(got, first.model.parameters()):
            assert torch.equal(g, f.detach()), t.name
        mine, theirs = state_tensors(t.opt.optimizer), state_tensors(first.opt.optimizer)
        assert [k for k, _ in mine] == [k for k, _ in theirs]
        for (key, a), (_, b) in zip(mine, theirs):
            assert torch.equal(a, b), (t.name, key)
    ours, refs = state_tensors(first.opt.optimizer), state_tensors(ref_opt)
    assert [k for k, _ in ours] == [k for k, _ in refs]
    for (key, a), (_, b) in zip(ours, refs):
        assert rel_error(a.double().numpy(), b.double().numpy()) <= tol, key


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_every_replica_trains_like_one_process_on_the_global_batch(local_tree, optimizer):
    """float64, 20 steps, one host always slow (it abandons the steps the tree finishes
    without it), the others slow now and then: parameters to 1e-9 of single-process
    training, optimizer state identical on every replica."""
    m, steps = 28, 20
    lt = local_tree(SMALL, m)
    trainers = [Trainer(lt, n, torch.float64, optimizer, slow_p=0.1, slow_s=0.01)
                for n in SMALL.names()]
    always_slow = next(t for t in trainers if t.name == "1.0")
    always_slow.slow_p, always_slow.slow_s = 1.0, 0.05
    run_trainers(trainers, steps)
    assert_replicas_equal_reference(trainers, torch.float64, optimizer, steps, m, 1e-9)
    assert always_slow.opt.abandoned > 0            # it stopped computing finished steps
    assert sum(t.opt.skipped + t.opt.resyncs for t in trainers) == 0
    assert all(t.opt.copied_bytes == 0 for t in trainers)


def test_coded_weights_train_exactly_in_float64(local_tree):
    """The 13-host tree: cyclic-repetition weights (0.89, -0.5, ...), two stragglers."""
    m, steps = 60, 20
    lt = local_tree(CODED, m)
    trainers = [Trainer(lt, n, torch.float64, "momentum") for n in CODED.names()]
    for t in trainers:
        if t.name in ("0.1", "2"):
            t.slow_p, t.slow_s = 1.0, 0.03
    run_trainers(trainers, steps)
    assert any(w < 0 for t in trainers for _, _, w in t.client.assignment.ranges)
    assert_replicas_equal_reference(trainers, torch.float64, "momentum", steps, m, 1e-9)


def test_float32_models_train_to_1e_5(local_tree):
    m, steps = 28, 20
    lt = local_tree(SMALL, m)
    trainers = [Trainer(lt, n, torch.float32, "adam", slow_p=0.1, slow_s=0.01)
                for n in SMALL.names()]
    run_trainers(trainers, steps)
    assert all(p.dtype == torch.float32 for t in trainers for p in t.model.parameters())
    assert_replicas_equal_reference(trainers, torch.float32, "adam", steps, m, 1e-5)


def test_a_step_that_fails_tree_wide_is_skipped_by_every_replica(local_tree):
    """No straggler tolerated, and host 1's process sits step 3 out: the master fails the
    step at --timeout, every replica skips its update (the same StepFailed everywhere),
    and all go on in lockstep, equal to single-process training without that step."""
    m, steps = 12, 6
    tree = Tree.regular(2, 1, 0)
    lt = local_tree(tree, m, timeout=1)

    def body(t):
        while t.opt.step_index < steps:
            if t.name == "1" and t.opt.step_index == 3:
                while not t.client.finished(3):      # until the master gave up on it
                    time.sleep(0.01)
                t.opt.zero_grad()
                assert not t.opt.step()
            t.train(t.opt.step_index + 1)

    trainers = run_trainers([Trainer(lt, n, torch.float64, "momentum") for n in tree.names()],
                            steps, body)
    assert all(t.opt.skipped == 1 and t.opt.resyncs == 0 for t in trainers)
    assert_replicas_equal_reference(trainers, torch.float64, "momentum", steps, m, 1e-9,
                                    skipped={3})


def test_gradients_are_views_of_the_clients_shared_memory(local_tree):
    """Backward writes into the client's shared input, the update reads the shared output:
    nothing is copied; a .grad replaced behind the optimizer's back is copied (and counted)."""
    m = 12
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, m)
    seen = {}

    def body(t):
        c, opt = t.client, t.opt
        n = sum(p.numel() for p in t.model.parameters())
        shared_in, shared_out = c.buffer(n, np.float64), c.result_buffer(n, np.float64)
        for step in range(3):
            if step == 2 and t.name == "0":
                t.model.zero_grad()                   # set_to_none: backward makes new tensors
            else:
                opt.zero_grad()
            indices, weights = t.sampler.local(step)
            if len(indices):
                weighted_loss(per_sample_loss(t.model, t.x[indices], t.y[indices]),
                              weights).backward()
            views = [p.grad is not None and np.shares_memory(p.grad.numpy(), shared_in)
                     for p in t.model.parameters()]
            seen.setdefault(t.name, []).append(views)
            assert opt.step()
            for p in t.model.parameters():
                assert np.shares_memory(p.grad.numpy(), shared_out)
                lo = shared_out.__array_interface__["data"][0]
                assert lo <= p.grad.data_ptr() < lo + shared_out.nbytes
        seen[t.name + ":copied"] = opt.copied_bytes
        seen[t.name + ":n"] = n

    trainers = run_trainers([Trainer(lt, n, torch.float64, "sgd") for n in tree.names()], 3, body)
    for t in trainers:
        views = seen[t.name]
        assert all(views[0]) and all(views[1])
        if t.name == "0":
            assert not any(views[2])
            assert seen["0:copied"] == 8 * seen["0:n"]       # the one fallback copy, counted
        else:
            assert all(views[2]) and seen[t.name + ":copied"] == 0
    assert_replicas_equal_reference(trainers, torch.float64, "sgd", 3, m, 1e-9)


# ---------------------------------------------------------------- pieces


def test_unsupported_dtypes_get_a_clear_type_error():
    model = make_model(torch.float32).to(torch.bfloat16)
    with pytest.raises(TypeError, match=r"float32 and float64.*bfloat16.*torch.autocast"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, None)
    mixed = make_model(torch.float32)
    mixed[2].to(torch.float64)
    with pytest.raises(TypeError, match=r"mix torch.float32, torch.float64.*model.to"):
        DistributedOptimizer(torch.optim.SGD(mixed.parameters(), lr=0.1), mixed, None)
    with pytest.raises(TypeError, match=r"torch\.float16"):
        allreduce(None, torch.ones(3, dtype=torch.float16), step=0)
    with pytest.raises(TypeError, match=r"torch\.int64"):
        allreduce(None, torch.ones(3, dtype=torch.int64), step=0)


def test_the_weighted_loss_has_the_coded_share_as_its_gradient():
    model = make_model(torch.float64)
    x, y = data(torch.float64)
    x, y = x[:6], y[:6]
    w = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, 0.8944])
    weighted_loss(per_sample_loss(model, x, y), w).backward()
    got = [p.grad.clone() for p in model.parameters()]
    want = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(6):
        model.zero_grad()
        per_sample_loss(model, x[i:i + 1], y[i:i + 1]).sum().backward()
        for acc, p in zip(want, model.parameters()):
            acc += float(w[i]) * p.grad
    for g, wnt in zip(got, want):
        torch.testing.assert_close(g, wnt, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="reduction='none'"):
        weighted_loss((model(x) - y) ** 2, w)


def test_a_replicas_state_vector_carries_the_model_and_adam_state_to_a_fresh_replica():
    """What a peer sends a process that (re)joins, without daemons: the fresh replica
    (another model, no optimizer state yet) ends equal to the trained one. The layout is
    the ReplicaState's own, learned once, and again only when the parameters change."""
    x, y = data(torch.float64)
    trained = make_model(torch.float64)
    opt = torch.optim.Adam(trained.parameters(), lr=0.02)
    for _ in range(3):
        opt.zero_grad()
        per_sample_loss(trained, x, y).mean().backward()
        opt.step()
    fresh = make_model(torch.float64, seed=5)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
    sent, taken = ReplicaState(trained, opt), ReplicaState(fresh, fresh_opt)
    assert sent.size() == taken.size()
    vec = np.full(sent.size(), np.nan)
    sent.pack(vec)
    layout = taken.layout
    taken.load(vec)
    for a, b in zip(fresh.parameters(), trained.parameters()):
        assert torch.equal(a, b)
    assert [k for k, _ in state_tensors(fresh_opt)] == [k for k, _ in state_tensors(opt)]
    for (_, a), (_, b) in zip(state_tensors(fresh_opt), state_tensors(opt)):
        assert torch.equal(a, b)
    assert fresh_opt.param_groups[0]["lr"] == 0.02
    assert taken.layout is layout
    fresh_opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]})
    assert taken.layout is not layout and taken.layout.size > layout.size


def test_the_samplers_shares_add_up_to_the_global_batch(local_tree):
    """Each process allreduces sum_i w_i onehot(index_i) as a tensor: the tree's sum must
    count every data set index of the step's global batch exactly (the coding cancels);
    ``result`` gives the same vector to a process that asks again, where the daemon kept
    it: a leaf's daemon that received it straight into the process's shared output kept
    no copy (StepLost)."""
    m = 60
    lt = local_tree(CODED, m)
    got: dict[str, list] = {}

    def body(t):
        outs = []
        for step in range(6):           # 6 x 60 over 150 samples: three epochs, straddled
            indices, weights = t.sampler.local(step)
            one_hot = torch.zeros(DATASET, dtype=torch.float64)
            one_hot.index_add_(0, indices, weights)
            outs.append((t.sampler.global_batch(step), allreduce(t.client, one_hot, step)))
        try:
            outs.append(result(t.client, 5, torch.empty(DATASET, dtype=torch.float64)))
        except StepLost as e:
            outs.append(e)
        got[t.name] = outs

    run_trainers([Trainer(lt, n, torch.float64, "sgd") for n in CODED.names()], 0, body)
    batches = BatchSampler(DATASET, m, SAMPLER_SEED)
    for name, outs in got.items():
        for step, (batch, total) in enumerate(outs[:-1]):
            np.testing.assert_array_equal(batch.numpy(), batches.indices(step))
            want = np.bincount(batches.indices(step), minlength=DATASET)
            assert isinstance(total, torch.Tensor) and total.dtype == torch.float64
            assert rel_error(total.numpy(), want) <= 1e-12, step
        again = outs[-1]
        if isinstance(again, StepLost):
            assert not CODED.children(name) and "shared memory" in str(again), (name, again)
        else:
            assert torch.equal(again, outs[5][1])
    assert all(isinstance(got[n][-1], torch.Tensor) for n in CODED.names() if CODED.children(n))


# ---------------------------------------------------------------- state from a peer (needs the
# daemon's broadcast API: Client.broadcast, request_state, state_wanted, send_state)


def test_broadcast_gives_everyone_the_roots_parameters_and_optimizer_state(local_tree):
    """Every process starts from another random model; the root (host "0") from a
    "checkpoint" with Adam state. After the broadcasts all replicas equal the root's and
    train in lockstep."""
    m = 28
    lt = local_tree(SMALL, m)
    checkpoint = {}

    def body(t):
        root = t.name == "0"
        if root:                   # a few local steps: parameters and Adam state to restore
            x, y = data(torch.float64)
            for _ in range(3):
                t.opt.optimizer.zero_grad()
                per_sample_loss(t.model, x, y).mean().backward()
                t.opt.optimizer.step()
            checkpoint["params"] = [p.detach().clone() for p in t.model.parameters()]
            checkpoint["state"] = [v.clone() for _, v in state_tensors(t.opt.optimizer)]
        else:
            assert not t.opt.optimizer.state
        broadcast_parameters(t.model, t.client, root=root)
        broadcast_optimizer_state(t.opt.optimizer, t.client, root=root)
        # the default keys are counted by the client: one call each so far
        assert t.client.numbered_key("crnet.torch/parameters") == "crnet.torch/parameters/1"
        t.after_broadcast = ([p.detach().clone() for p in t.model.parameters()],
                             [v.clone() for _, v in state_tensors(t.opt.optimizer)])
        t.train(5)

    trainers = [Trainer(lt, n, torch.float64, "adam", seed=i) for i, n in enumerate(SMALL.names())]
    run_trainers(trainers, 5, body)
    for t in trainers:
        params, state = t.after_broadcast
        assert all(torch.equal(a, b) for a, b in zip(params, checkpoint["params"])), t.name
        assert len(state) == len(checkpoint["state"]) == 3 * len(params)
        assert all(torch.equal(a, b) for a, b in zip(state, checkpoint["state"])), t.name
        for a, b in zip(t.model.parameters(), trainers[0].model.parameters()):
            assert torch.equal(a, b)
        for (_, a), (_, b) in zip(state_tensors(t.opt.optimizer),
                                  state_tensors(trainers[0].opt.optimizer)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_process_restarted_mid_job_takes_the_state_from_a_peer(local_tree, optimizer):
    """Host 1.1's process dies after step 5; the tree goes on without it. A new process for
    the host, with another random model and a fresh optimizer, gets the parameters and
    optimizer state from a peer at the next step boundary and trains in lockstep: at the
    end every replica equals single-process training."""
    m, steps, dies_at, pause_at = 28, 20, 6, 12
    lt = local_tree(SMALL, m)
    rejoined = threading.Event()

    def body(t):
        if t.name == "1.1":
            t.train(dies_at)
            t.client.close()                        # the process dies ...
            try:
                t.start(seed=99)                    # ... a new one: another model, no state
            finally:
                rejoined.set()
            # The state after the newest step some peer had applied when it asked: the
            # one the old process applied last, or a later one.
            assert t.opt.resyncs == 1 and t.opt.step_index >= dies_at
            t.train(steps)
            return
        t.train(pause_at)       # survivors hold at a step boundary until the newcomer asks
        deadline = time.monotonic() + 30
        while not (rejoined.is_set() or t.client.state_wanted()):
            assert time.monotonic() < deadline, "the restarted process never asked for the state"
            time.sleep(0.005)
        t.train(steps)

    trainers = [Trainer(lt, n, torch.float64, optimizer) for n in SMALL.names()]
    run_trainers(trainers, steps, body)
    newcomer = next(t for t in trainers if t.name == "1.1")
    assert len(newcomer.opts) == 2
    assert sum(t.opt.answered for t in trainers) >= 1
    assert_replicas_equal_reference(trainers, torch.float64, optimizer, steps, m, 1e-9)


def test_learning_a_layout_leaves_an_optimizer_with_a_scheduler_untouched():
    """An LR scheduler puts a wrapped ``step`` on the optimizer object itself; the probe
    step that learns the layout must not run it on the real optimizer."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(opt, 1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    assert ReplicaState(model, opt).size() > sum(p.numel() for p in model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert not opt.state   # no real step: no Adam state yet
