"""CUDA tensors in crnet.torch: through a pinned host buffer (crnet/torch/staging.py).

Each training test runs twice: on ``cuda`` (a real GPU: skipped where
``torch.cuda.is_available()`` is false, as on the development machine and in CI) and on
``fake``, a device made for these tests: CPU tensors that take the staged path, with
copies that behave like a stream's (``DeferredDevice``: a copy down reaches the host
only when an event recorded after it is synchronised, so a read without the wait sees
stale values; a copy up whose host buffer is overwritten before its event is
synchronised is reported). The training tests compare with single-process training
(float64, 1e-9), as tests/torch/test_torch.py and tests/torch/test_torch_ddp.py do: crnet's
DistributedOptimizer, and DDP on crnet process groups with the crnet hook (one host per
thread; each thread's ``CrnetProcessGroup`` is its DDP's group). The rest checks the
staging itself, that CPU tensors never go through it, and the error for mixed devices.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from crnet import Client  # noqa: E402
from crnet.coding.plan import Tree  # noqa: E402
from crnet.torch import (  # noqa: E402
    CodedSampler,
    CrnetProcessGroup,
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
    register_crnet_hook,
    staging,
    weighted_loss,
)
from crnet.torch.gradients import SharedGradients  # noqa: E402
from crnet.torch.staging import DeviceOps, HostStaging, one_device  # noqa: E402

from ..helpers.vectors import rel_error  # noqa: E402
from .test_torch import (  # noqa: E402
    OPTIMIZERS,
    Trainer,
    data,
    make_model,
    per_sample_loss,
    reference,
    run_trainers,
)

pytestmark = pytest.mark.timeout(180)

GPU = pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU here (torch.cuda.is_available() is False)"))
DEVICES = [GPU, "fake"]


class _Event:
    def __init__(self, device: DeferredDevice, at: int):
        self.device, self.at = device, at

    def synchronize(self) -> None:
        self.device.run_until(self.at)


class DeferredDevice(DeviceOps):
    """CPU tensors as a device's, with a stream's ordering (one stream per thread)."""

    pin_memory = False

    def __init__(self):
        self.local = threading.local()
        self.seq = itertools.count()
        self.errors: list[str] = []
        self.syncs = 0

    def queue(self) -> list:
        return self.local.__dict__.setdefault("queue", [])

    def staged(self, device):
        return True

    def copy_down(self, host, t):
        self.queue().append((next(self.seq), "down", host, t.detach().clone()))   # as it is now

    def copy_up(self, t, host):
        t.copy_(host)       # the device's later work sees it (stream order)...
        self.queue().append((next(self.seq), "up", host, host.clone()))  # ...read from here

    def record(self, device):
        return _Event(self, next(self.seq))

    def run_until(self, at: int) -> None:
        self.syncs += 1
        q = self.queue()
        while q and q[0][0] < at:
            _, kind, host, value = q.pop(0)
            if kind == "down":
                host.copy_(value)
            elif not torch.equal(host, value):
                self.errors.append("the host wrote a buffer a copy up was still reading")


@pytest.fixture
def device(request, monkeypatch):
    """``cuda``, or ``fake``: every HostStaging made from here on uses a DeferredDevice."""
    if request.param in ("cuda", "cpu"):
        yield torch.device(request.param)
        return
    fake = DeferredDevice()
    monkeypatch.setattr(staging, "DEVICES", fake)
    yield torch.device("cpu")
    assert not fake.errors, fake.errors
    assert fake.syncs > 0            # the staged path was taken


def on(device, *tensors):
    return [t.to(device) for t in tensors]


# ---------------------------------------------------------------- the staging

def test_the_buffer_is_allocated_once_and_reused_while_big_enough():
    fake = DeferredDevice()
    st = HostStaging(fake)
    a, b = torch.arange(10.0, dtype=torch.float64), torch.arange(5, dtype=torch.int32)
    first = st.down([a, b])
    assert [torch.equal(h, t) for h, t in zip(first, [a, b])] == [True, True]
    ptr = first[0].data_ptr()
    for _ in range(3):                                   # the same size, or smaller: reused
        again = st.down([a[:4], b])
        assert again[0].data_ptr() == ptr and st.allocations == 1
        assert torch.equal(again[1], b) and again[1].data_ptr() % 64 == 0   # aligned
    big = torch.ones(1000)
    assert torch.equal(st.down([big])[0], big) and st.allocations == 2      # grown once
    assert st.down([a])[0].data_ptr() == st.flat(1, torch.float64).data_ptr()
    assert st.allocations == 2 and st.copied_bytes == 80 + 20 + 3 * (32 + 20) + 4000 + 80


def test_the_host_reads_a_copy_down_only_after_waiting_for_it():
    fake = DeferredDevice()
    st = HostStaging(fake)
    t = torch.arange(4.0)
    host = st.flat(4, torch.float32)
    host.zero_()
    st.to_host(host, t)
    t.add_(100)                  # later device work: after the copy in stream order
    assert torch.equal(host, torch.zeros(4))            # not there yet: a read must wait
    st.wait(t.device)
    assert torch.equal(host, torch.arange(4.0))


def test_the_host_writes_the_buffer_again_only_once_the_copies_up_have_read_it():
    fake = DeferredDevice()
    st = HostStaging(fake)
    dev = torch.zeros(4)
    host = st.room([dev])
    host[0].fill_(7)
    st.up([dev], host)
    assert torch.equal(dev, torch.full((4,), 7.0))
    syncs = fake.syncs
    st.room([dev])[0].fill_(1)          # room() waited for the copy up first
    assert fake.syncs == syncs + 1 and not fake.errors
    st.to_device(dev, st.flat(4, torch.float32))
    st.queued(dev.device)
    fake.errors.clear()
    st._up = None                 # a staging that forgot to wait would be caught:
    st.flat(4, torch.float32).fill_(2)
    st.wait(dev.device)
    assert fake.errors


def test_cpu_tensors_never_go_through_the_staging():
    st = HostStaging()          # the default: pinning would fail here, there is no GPU
    t = torch.arange(6.0).reshape(2, 3)
    assert st.down([t])[0] is t and st.room([t])[0] is t
    st.up([t], [t])
    assert st.allocations == 0 and st.copied_bytes == 0
    model = torch.nn.Linear(3, 2).double()
    grads = SharedGradients(list(model.parameters()), client=None, views=True)  # type: ignore[arg-type]
    assert grads.on_host and grads.views and grads.staging.allocations == 0


def test_tensors_on_several_devices_get_a_clear_error():
    cpu, meta = torch.zeros(2), torch.zeros(2, device="meta")
    assert one_device([cpu, cpu]) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"parameters on several devices \(cpu, meta\).*one device"):
        one_device([cpu, meta], "parameters")
    model = torch.nn.Linear(3, 2)
    model.bias = torch.nn.Parameter(torch.zeros(2, device="meta"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="parameters on several devices"):
        DistributedOptimizer(opt, model, client=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="several devices"):
        HostStaging().down([cpu, meta])


# ---------------------------------------------------------------- training on a device

class DeviceTrainer(Trainer):
    """test_torch's training process with the model and the data on ``device``."""

    def __init__(self, *args, device, **kw):
        super().__init__(*args, **kw)
        self.device = device
        self.x, self.y = on(device, self.x, self.y)

    def start(self, seed=None):
        self.client = self.connect()
        self.model = make_model(self.dtype, self.seed if seed is None else seed).to(self.device)
        self.opt = DistributedOptimizer(OPTIMIZERS[self.optimizer](self.model.parameters()),
                                        self.model, self.client)
        self.opts.append(self.opt)
        self.sampler = CodedSampler(150, self.client, seed=7)


def run_threads(fn, names):
    errors, everyone = {}, threading.Barrier(len(names))

    def run(name):
        try:
            everyone.wait(60)
            fn(name)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors[name] = e
            everyone.abort()

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    if errors:
        pytest.fail("\n".join(f"{n or 'master'}: {e!r}" for n, e in errors.items()), pytrace=False)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_distributed_optimizer_on_a_device_trains_like_one_process(local_tree, device):
    """Gradients down through the staging, results up, every step; a checkpoint's
    parameters and Adam state broadcast through it too."""
    tree, m, steps = Tree.regular(2, 1, 1), 12, 6
    lt = local_tree(tree, m)
    trainers = {n: DeviceTrainer(lt, n, torch.float64, "adam", device=device) for n in tree.names()}

    def body(t):              # after start() (the DistributedOptimizer) and a barrier
        t.train(steps)
        broadcast_parameters(t.model, t.client, root=0)
        broadcast_optimizer_state(t.opt.optimizer, t.client, root=0)
        t.params = [p.detach().cpu() for p in t.model.parameters()]
        t.state = [v.cpu() for s in t.opt.optimizer.state.values() for v in s.values()]

    run_trainers(list(trainers.values()), steps, body)
    ref, _ = reference(torch.float64, "adam", steps, m)
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    for t in trainers.values():
        got = torch.cat([p.reshape(-1) for p in t.params])
        assert rel_error(got.numpy(), want.numpy()) <= 1e-9, t.name
        assert all(torch.equal(a, b) for a, b in zip(t.state, trainers["0"].state))
        n = sum(p.numel() for p in t.params)
        assert t.opt.grads.staging.allocations == 1            # the gradient's buffer: once
        assert 0 < t.opt.copied_bytes <= 4 * 8 * n * steps      # down, in, out, up


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_ddp_with_the_crnet_hook_on_a_device_trains_like_one_process(local_tree, device):
    """DDP on each host's crnet process group (its constructor's broadcasts and
    allgathers go through the backend), the gradient through the hook: its buckets down,
    one crnet step, the result up."""
    tree, m, steps = Tree.regular(2, 1, 1), 12, 5
    lt = local_tree(tree, m)
    names = list(tree.names())
    x, y = on(device, *data(torch.float64))
    got, counts = {}, {}

    def train(name):
        c = Client(lt.socket_path(name), timeout=60)
        try:
            pg = CrnetProcessGroup(c, names.index(name), len(names), "test/pg", 60.0,
                                   range(len(names)))   # one process a host: tree order
            model = DDP(make_model(torch.float64, seed=names.index(name)).to(device),
                        process_group=pg, bucket_cap_mb=0.0002)
            if name == names[0]:
                # rank 0 (the master's: an empty share) comes late, once the tree decided
                # step 0 without it: by default it takes the held results, not a peer's
                # state, which would wait for ever: its peers wait in DDP's bucket rebuild,
                # a broadcast from rank 0
                time.sleep(1.0)
            opt = register_crnet_hook(model, OPTIMIZERS["momentum"](model.parameters()), c)
            sampler = CodedSampler(150, c, seed=7)
            while opt.step_index < steps:
                idx, w = sampler.local(opt.step_index)
                opt.zero_grad()
                for i, wi in opt.micro_batches(idx, w, size=4):
                    weighted_loss(per_sample_loss(model, x[i], y[i]), wi).backward()
                opt.step()
            got[name] = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
            counts[name] = (opt.reductions, opt.buckets, opt.grads.on_host, opt.grads.staging.allocations,
                            opt.applied, opt.skipped, opt.resyncs, opt.abandoned, c.stale)
        finally:
            c.close()

    run_threads(train, names)
    # rank 0 (the master's thread) started everyone from its parameters: make_model(seed 0)
    ref, _ = reference(torch.float64, "momentum", steps, m)
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()]).numpy()
    for name in names:
        assert rel_error(got[name].numpy(), want) <= 1e-9, name
        assert torch.equal(got[name], got[names[0]])
        # one crnet step per training step, several buckets, all through one staging buffer
        assert counts[name][0] == steps and counts[name][1] >= 2, counts
        assert counts[name][2:4] == (False, 1) and counts[name][6] == 0, counts   # no resync


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_the_backends_collectives_of_device_tensors_are_exact(local_tree, device):
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, 12)
    names = list(tree.names())
    size = len(names)
    seen = {}

    def collect(name):
        rank = names.index(name)
        c = Client(lt.socket_path(name), timeout=60)
        try:
            pg = CrnetProcessGroup(c, rank, size, "test/coll", 60.0, range(size))
            opts = dist.BroadcastOptions()
            opts.rootRank = 1
            b = on(device, torch.tensor([rank, -1, 2**53 + 1], dtype=torch.int64))[0]
            pg.broadcast([b], opts).wait()
            s = on(device, torch.full((3,), 0.1 * (rank + 1), dtype=torch.float64))[0]
            ar = dist.AllreduceOptions()
            ar.reduceOp = dist.ReduceOp.SUM
            pg.allreduce([s], ar).wait()
            outs = [on(device, torch.zeros(2, dtype=torch.float32))[0] for _ in range(size)]
            pg.allgather([outs], on(device, torch.tensor([rank, rank + 0.5]))).wait()
            flat = on(device, torch.zeros(2 * size))[0]
            pg.all_gather_single(flat, on(device, torch.tensor([rank, -rank], dtype=torch.float32))[0])
            seen[name] = (b.cpu().tolist(), s.cpu().tolist(), [o.cpu().tolist() for o in outs],
                          flat.cpu().tolist(), str(b.device))
            with pytest.raises(ValueError, match=r"all_reduce on several devices \(.*meta\)"):
                pg.allreduce([s, torch.zeros(1, device="meta")], ar)     # before any message
        finally:
            c.close()

    run_threads(collect, names)
    want_sum = 0.0
    for r in range(size):
        want_sum += 0.1 * (r + 1)
    for name in names:
        b, s, outs, flat, where = seen[name]
        assert b == [1, -1, 2**53 + 1] and s == [want_sum] * 3
        assert outs == [[r, r + 0.5] for r in range(size)]
        assert flat == [v for r in range(size) for v in (r, -r)]
        assert where.startswith(device.type)
