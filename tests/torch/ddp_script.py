"""A PyTorch DDP training script on the crnet backend, as docs/torch.md shows it: a plain
DDP script changed only by the backend name, the hook registration, the sampler and the
weighted loss (tests/torch/test_torch_ddp.py runs it under ``crnet run``).

Besides training it checks torch.distributed's collectives on the crnet group and writes
what it saw to ``<out>/collectives-<rank>.json``, and the final parameters and counters
to ``<out>/params-<rank>.npy`` and ``<out>/run-<rank>.json``.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from crnet.torch import CodedSampler, register_crnet_hook, weighted_loss

DATASET, FEATURES, HIDDEN, OUTPUTS = 150, 5, 8, 3
SEED = 7


def data():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((DATASET, FEATURES))
    y = np.tanh(x @ rng.standard_normal((FEATURES, OUTPUTS))) + 0.1 * rng.standard_normal((DATASET, OUTPUTS))
    return torch.from_numpy(x), torch.from_numpy(y)


def make_model(seed):
    """Each rank starts elsewhere (seed = rank): DDP gives every one rank 0's parameters."""
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, OUTPUTS)).double()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(0.5 * rng.standard_normal(tuple(p.shape))))
    return model


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def collectives(out):
    """torch.distributed's calls on the crnet group, what each returned, and the errors."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = {}
    t = torch.full((4,), 0.1 * (rank + 1), dtype=torch.float64)
    dist.all_reduce(t)
    seen["sum"] = t.tolist()
    t = torch.full((2,), float(rank), dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    seen["avg"] = t.tolist()
    t = torch.tensor([rank, -rank, 1 << 60], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    seen["max"] = t.tolist()
    # any dtype goes as its bytes: -1 as int64 is a NaN's bit pattern as float64
    bits = torch.tensor([-1, 2**53 + 1, rank], dtype=torch.int64)
    half = torch.tensor([1.5, rank], dtype=torch.bfloat16)
    flags = torch.tensor([rank % 2 == 0, True])
    for tensor in (bits, half, flags):
        dist.broadcast(tensor, src=world - 1)
    seen["bits"], seen["half"], seen["flags"] = bits.tolist(), half.float().tolist(), flags.tolist()
    model = make_model(rank)
    for v in model.state_dict().values():       # a model tensor by tensor: paced by barriers
        dist.broadcast(v, src=0)
    seen["params"] = torch.cat([p.reshape(-1) for p in model.parameters()]).tolist()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "pid": os.getpid()})
    seen["objects"] = objs
    dist.barrier()
    errors = {}
    for name, call in [("reduce", lambda: dist.reduce(torch.zeros(1), dst=0)),
                       ("reduce_scatter", lambda: dist.reduce_scatter_tensor(torch.zeros(1),
                                                                             torch.zeros(world))),
                       ("all_to_all", lambda: dist.all_to_all_single(torch.zeros(world),
                                                                     torch.zeros(world))),
                       ("band", lambda: dist.all_reduce(torch.zeros(1, dtype=torch.int64),
                                                        op=dist.ReduceOp.BAND)),
                       ("gather", lambda: dist.gather(torch.zeros(1), [torch.zeros(1)] * world
                                                      if rank == 0 else None, dst=0)),
                       ("scatter", lambda: dist.scatter(torch.zeros(1), [torch.zeros(1)] * world
                                                        if rank == 0 else None, src=0)),
                       ("send", lambda: dist.send(torch.zeros(1), dst=(rank + 1) % world)),
                       ("recv", lambda: dist.recv(torch.zeros(1), src=(rank + 1) % world)),
                       ("new_group", lambda: dist.new_group())]:
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001  (the test checks which, and what it says)
            errors[name] = f"{type(e).__name__}: {e}"
    seen["errors"] = errors
    with open(os.path.join(out, f"collectives-{rank}.json"), "w") as f:
        json.dump(seen, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--straggle-prob", type=float, default=0.0)
    ap.add_argument("--straggle-ms", type=float, default=0.0)
    ap.add_argument("--sit-out", type=int, metavar="STEP",
                    help="compute nothing of this step until the tree decided it")
    a = ap.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group("crnet")
    rank = dist.get_rank()
    collectives(a.out)
    slow = np.random.default_rng(1000 + rank)
    x, y = data()
    model = DDP(make_model(rank), bucket_cap_mb=0.0002)      # tiny buckets: one per parameter or so
    opt = register_crnet_hook(model, make_optimizer(model.parameters()))
    sampler = CodedSampler(DATASET, opt.client, seed=SEED)
    while opt.step_index < a.steps:
        idx, w = sampler.local(opt.step_index)
        if opt.step_index == a.sit_out:
            while not opt.client.finished(opt.step_index):   # with no straggler tolerated, the
                time.sleep(0.01)                              # master fails it at --timeout
        opt.zero_grad()
        for i, wi in opt.micro_batches(idx, w, size=a.micro):
            if len(i) and slow.random() < a.straggle_prob:
                time.sleep(a.straggle_ms / 1000)
            losses = F.mse_loss(model(x[i]), y[i], reduction="none").mean(dim=1)
            weighted_loss(losses, wi).backward()
        opt.step()

    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(a.out, f"params-{rank}.npy"), params)
    with open(os.path.join(a.out, f"run-{rank}.json"), "w") as f:
        json.dump({"reductions": opt.reductions, "applied": opt.applied, "skipped": opt.skipped,
                   "resyncs": opt.resyncs, "abandoned": opt.abandoned, "buckets": opt.buckets}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
