"""The honest side of the authenticated fuzzer: a training process per host, the README's loop.

    python -m benchmarks.fuzz_trainers '{"sockets": {...}, "samples": 60, "elements": 96, ...}'

Runs in a process of its own (so the fuzzer's own work never delays their waits), one
asyncio task per host, each with the public ``AsyncClient``: ``barrier("start")``, then
every step its gradient, ``allreduce``, the README's answers to ``StepFailed``,
``StepLost`` and ``StepRefused`` (``request_state`` when cut off or behind), and
``send_state`` when a process asks. Until its standard input closes (then every process
goes on to one step past the newest any began, and stops there). Sample i's gradient
is a fixed vector of small integers times (step + 1), so every sum is known in advance
and checked against numpy's float64 sum to 1e-9 relative. Each call is timed.

Writes one JSON line per outcome to standard output: ``{"host", "step", "outcome",
"wait", "what"}``, outcome one of exact, wrong, failed (``tree_wide`` in what), lost,
refused, resync (``request_state`` answered), no state (it was not: no process could
answer), timeout (CrnetTimeout: the daemon did not answer within its bound), error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import numpy as np

from crnet import AsyncClient, CrnetError, CrnetTimeout, StepFailed, StepLost, StepRefused

TOLERANCE = 1e-9
LR = 1e-3


def gradients(samples: int, elements: int) -> np.ndarray:
    """Per-sample gradients: small integers, positive and negative, none alike."""
    i, j = np.meshgrid(np.arange(samples), np.arange(elements), indexing="ij")
    return ((7 * i + 13 * j + i * j) % 23 - 11).astype(np.float64)


def report(host: str, step: int, outcome: str, wait: float, what: str = "") -> None:
    print(json.dumps({"host": host, "step": step, "outcome": outcome, "wait": round(wait, 4),
                      "what": what[:300]}), flush=True)


class End:
    """Where every process stops: once the fuzzer is done, a step after any process's, so
    that all take part in every step until the last one (none is left short of processes)."""

    def __init__(self) -> None:
        self.at: dict[str, int] = {}     # host -> the step it is on
        self.last: int | None = None

    def stop(self) -> None:
        self.last = max(self.at.values(), default=0) + 1

    def goes_on(self, host: str, step: int) -> bool:
        self.at[host] = step
        return self.last is None or step <= self.last


async def train(host: str, path: str, spec: dict, end: End) -> None:
    """The README's loop (``README.md``, "The training loop") on ``AsyncClient``."""
    grads = gradients(spec["samples"], spec["elements"])
    want = grads.sum(axis=0)
    c = await AsyncClient.connect(path, timeout=120)
    pos, weight = c.assignment.positions()
    local = weight @ grads[pos] if len(pos) else np.zeros(spec["elements"])
    w = np.zeros(spec["elements"])
    t0 = time.monotonic()
    try:
        await c.barrier("start", processes=spec["processes"], timeout=120)
    except CrnetError as e:
        report(host, -1, "error", time.monotonic() - t0, f"barrier: {type(e).__name__}: {e}")
    step = 0
    while end.goes_on(host, step):
        t0 = time.monotonic()
        try:
            if c.stale:
                if end.last is not None:         # the end: no state to take any more
                    break
                t0 = time.monotonic()
                try:
                    w, after = await c.request_state(w)
                except CrnetTimeout as e:        # every process was stale: none could answer
                    report(host, step, "no state", time.monotonic() - t0, str(e))
                    continue
                report(host, after, "resync", time.monotonic() - t0)
                step = after + 1
                continue
            if not c.finished(step):
                await asyncio.sleep(0.002 * (1 + step % 5))     # compute
            t0 = time.monotonic()
            g = await c.allreduce((step + 1) * local, step=step)
            wait = time.monotonic() - t0
            truth = (step + 1) * want
            error = float(np.max(np.abs(g - truth)) / max(1.0, float(np.max(np.abs(truth)))))
            report(host, step, "exact" if error <= TOLERANCE else "wrong", wait,
                   "" if error <= TOLERANCE else f"relative error {error:.3g}")
            w = w - LR * g / spec["samples"]
        except StepFailed as e:
            report(host, step, "failed", time.monotonic() - t0,
                   f"{'tree_wide' if e.tree_wide else 'local'}: {e}")
            if not e.tree_wide:
                continue                     # stale now: request_state above
        except StepLost as e:
            report(host, step, "lost", time.monotonic() - t0, str(e))
            continue                         # stale now
        except StepRefused as e:
            report(host, step, "refused", time.monotonic() - t0, str(e))
            await asyncio.sleep(0.1)
            continue
        except CrnetTimeout as e:
            report(host, step, "timeout", time.monotonic() - t0, str(e))
            if c.stale:
                continue
        except CrnetError as e:
            report(host, step, "error", time.monotonic() - t0, f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.1)
        try:
            if c.state_wanted():             # a (re)started process asks for the parameters
                t0 = time.monotonic()
                await c.send_state(w, step)
        except CrnetError as e:
            report(host, step, "error", time.monotonic() - t0, f"send_state: {type(e).__name__}: {e}")
        step += 1
    c.close()


async def main(spec: dict) -> None:
    end = End()
    loop = asyncio.get_running_loop()
    # Standard input closing (the fuzzer is done, or gone) stops every process.
    def closed() -> None:
        if not os.read(sys.stdin.fileno(), 1 << 16):
            loop.remove_reader(sys.stdin.fileno())
            end.stop()

    loop.add_reader(sys.stdin.fileno(), closed)
    tasks = [asyncio.ensure_future(train(h, p, spec, end)) for h, p in spec["sockets"].items()]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()      # a trainer's own bug: its traceback, exit 1


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
