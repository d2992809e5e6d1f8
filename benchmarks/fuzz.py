"""Fuzz a live tree from the outside: ``python -m benchmarks.fuzz --frames 20000``.

A local tree of real crnetd processes (authenticated with a cluster secret, as a tree
on a real network must be) runs a legitimate training step after every batch of
hostile traffic, and the fuzzer checks that every daemon is still alive, that each
one's memory stays bounded, and that the step's result is exact. The hostile traffic
is what a stranger on the network (or a local process) can send:

- random bytes, and valid frame prefixes with random types, lengths and bodies;
- structure-aware frames: every message type with hostile field values (out-of-range
  and negative integers, huge and non-ASCII strings, wrong types, missing fields) and
  random payloads, alone or after a well-formed hello;
- handshakes: hellos with nonces followed by forged or replayed proofs;
- slow senders (a byte now and then) and connection floods;
- the same at the training processes' Unix socket, and forged shared-memory
  hand-overs (a file, unsealed memory, a token nobody holds).

Every connection is opened and closed by the fuzzer; nothing leaves the machine.
Prints one line per batch and a summary; exits non-zero on a crash or a wrong result.

``--authenticated``: the hostile peer holds the secret and takes slots of the tree
instead (``benchmarks/fuzz_authenticated.py`` says what it sends and checks).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import sys
import time

import msgpack
import numpy as np

from crnet import AsyncClient
from crnet.coding.plan import Tree
from crnet.protocol.messages import CLASSES, Attach, Hello, PeerHello, Proof
from crnet.protocol.wire import MAGIC, PREFIX, VERSION, MsgType
from crnet.tools.launch import LocalTree

from .fuzz_authenticated import ELEMENTS, fuzz_authenticated
from .hostile_frames import frame, hostile_header


def one_attack(rng: random.Random) -> tuple[list[bytes], int]:
    """The bytes of one hostile connection, as the chunks it sends, and how many frames
    (or frame-sized pieces of garbage) they hold."""
    chunks = _attack(rng)
    return chunks, 1 if all(len(c) == 1 for c in chunks) else len(chunks)


def _attack(rng: random.Random) -> list[bytes]:
    kind = rng.random()
    if kind < 0.15:
        return [rng.randbytes(rng.randint(2, 300))]
    if kind < 0.3:                                 # a valid prefix, then anything
        msg_type = rng.choice(list(MsgType)).value if rng.random() < 0.8 else rng.randint(0, 255)
        hlen = rng.choice([0, 1, 10, 1000, 1 << 20, (1 << 32) - 1])
        plen = rng.choice([0, 1, 8, 1 << 20, (1 << 48)])
        return [PREFIX.pack(MAGIC, VERSION, msg_type, hlen, plen) + rng.randbytes(rng.randint(0, 200))]
    if kind < 0.75:                                # structure-aware frames
        out = []
        if rng.random() < 0.5:                     # after a well-formed hello
            first = Hello(rng.choice([None, "0", "1", "0.0"]), None, rng.randbytes(32))
            out.append(b"".join(bytes(p) for p in first.frame()))
        for _ in range(rng.randint(1, 4)):
            msg_type = rng.choice(list(CLASSES))
            try:
                head = msgpack.packb(hostile_header(rng, msg_type))
            except (ValueError, OverflowError):
                head = msgpack.packb({})
            payload = rng.randbytes(rng.choice([0, 1, 8, 64, 4096]))
            out.append(frame(msg_type, head, payload))
        return out
    if kind < 0.9:                                 # handshakes with forged proofs
        nonce = rng.randbytes(32)
        hello: Hello | PeerHello = (PeerHello(rng.randint(0, 3), nonce) if rng.random() < 0.3
                                    else Hello(rng.choice(["0", "1", None]), None, nonce))
        proof = Proof(rng.randbytes(32))
        return [b"".join(bytes(p) for p in hello.frame()),
                b"".join(bytes(p) for p in proof.frame()) * rng.randint(1, 3)]
    # A frame cut into single bytes: a slow sender (the fuzzer does not actually wait
    # seconds per byte; the deadline tests cover that).
    data = b"".join(bytes(p) for p in Hello("0", None, rng.randbytes(32)).frame())
    return [data[i:i + 1] for i in range(len(data))]


async def attack(connect, chunks: list[bytes]) -> None:
    """One hostile connection (``connect()`` opens it: TCP or the Unix socket)."""
    try:
        reader, writer = await asyncio.wait_for(connect(), 5)
    except (OSError, asyncio.TimeoutError):
        return
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        await asyncio.wait_for(reader.read(65536), 0.2)
    except (OSError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()


def tcp(port: int):
    return lambda: asyncio.open_connection("127.0.0.1", port)


def unix(path: str):
    return lambda: asyncio.open_unix_connection(path)


def forged_attach(path: str, rng: random.Random, tmp: str) -> None:
    """A shared-memory hand-over the daemon must refuse (no valid token, or no memfd)."""
    token = rng.choice(["", "f" * 32, "x" * 64, "0123456789abcdef0123456789abcdef"])
    if rng.random() < 0.5:
        fd = os.open(tmp, os.O_RDWR)
    else:
        fd = os.memfd_create("fuzz")
        os.ftruncate(fd, rng.choice([0, 4096, 1 << 20]))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)
            msg = b"".join(bytes(p) for p in Attach(token, rng.randint(1, 1 << 20)).frame())
            socket.send_fds(s, [msg], [fd])
    except OSError:
        pass
    finally:
        os.close(fd)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def fuzz(frames: int, batch: int, seed: int, workdir: str | None) -> int:
    rng = random.Random(seed)
    tree = Tree.regular(2, 2, 1)
    samples = 14
    grads = np.random.default_rng(seed).standard_normal((samples, 16))
    want = grads.sum(axis=0)
    lt = LocalTree(tree, samples, workdir=workdir, secret=True, log_level="warning", strict=True)
    lt.start()
    tmp_file = str(lt.workdir / "fuzz-file")
    with open(tmp_file, "wb") as f:
        f.write(b"\0" * 8192)
    clients: dict[str, AsyncClient] = {}
    crashes = wrong = sent = 0
    step = 0
    try:
        clients = {n: await AsyncClient.connect(lt.socket_path(n), timeout=60) for n in lt.procs}

        async def legit_step() -> bool:
            nonlocal step
            rs = await asyncio.gather(*(c.allreduce(_local(c, grads), step=step, timeout=60)
                                        for c in clients.values()))
            step += 1
            return all(np.allclose(r, want, rtol=1e-9, atol=1e-9) for r in rs)

        assert await legit_step()
        rss0 = {n: rss_kib(p.pid) for n, p in lt.procs.items()}
        ports = list(lt.ports.values())
        sockets = [lt.socket_path(n) for n in lt.procs]
        started = time.monotonic()
        while sent < frames:
            attacks = []
            for _ in range(batch):
                chunks, count = one_attack(rng)
                sent += count
                if rng.random() < 0.8:
                    attacks.append(attack(tcp(rng.choice(ports)), chunks))
                else:
                    attacks.append(attack(unix(rng.choice(sockets)), chunks))
            if rng.random() < 0.3:                 # a flood: many connections at once
                port = rng.choice(ports)
                attacks += [attack(tcp(port), [b""]) for _ in range(40)]
            await asyncio.gather(*attacks)
            for _ in range(3):
                await asyncio.to_thread(forged_attach, rng.choice(sockets), rng, tmp_file)
            dead = [n for n in lt.procs if not lt.alive(n)]
            if dead:
                crashes += len(dead)
                print(f"CRASH: {dead}", flush=True)
                break
            ok = await legit_step()
            wrong += not ok
            rss = {n: rss_kib(p.pid) for n, p in lt.procs.items()}
            print(f"{sent:>9} frames  {time.monotonic() - started:7.1f} s  step {step - 1} "
                  f"{'exact' if ok else 'WRONG'}  RSS max {max(rss.values()) / 1024:.1f} MiB",
                  flush=True)
        rss1 = {n: rss_kib(p.pid) for n, p in lt.procs.items()}
        print(f"\n{sent} hostile frames in {time.monotonic() - started:.1f} s; {step} legitimate "
              f"steps; crashes {crashes}; wrong results {wrong}")
        for n in lt.procs:
            print(f"  {lt.filename(n):8} RSS {rss0[n] / 1024:6.1f} -> {rss1[n] / 1024:6.1f} MiB")
    finally:
        for c in clients.values():
            c.close()
        lt.stop()
        problems = lt.problems()
        if problems:
            print("\n".join(problems), file=sys.stderr)
            crashes += len(problems)
    return 1 if crashes or wrong else 0


def _local(c: AsyncClient, grads: np.ndarray) -> np.ndarray:
    out = np.zeros(grads.shape[1])
    for start, stop, weight in c.assignment.ranges:
        out += weight * grads[start:stop].sum(axis=0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20_000, help="hostile frames to send")
    ap.add_argument("--batch", type=int, default=None,
                    help="connections between two checks (--authenticated: frames; default 200, 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="keep the daemons' logs here")
    ap.add_argument("--authenticated", action="store_true",
                    help="the hostile peer holds the cluster secret and takes slots of the tree "
                         "(benchmarks/fuzz_authenticated.py)")
    ap.add_argument("--timeout", type=float, default=2.0, help="--authenticated: the daemons' --timeout")
    ap.add_argument("--rate", type=float, default=400.0,
                    help="--authenticated: hostile frames a second, at most")
    ap.add_argument("--schemes", default="cr,spread",
                    help="--authenticated: the trees to fuzz, one after the other (cr, spread)")
    ap.add_argument("--restart-master", type=int, default=0, metavar="K",
                    help="--authenticated: kill and start the master again after every K batches")
    ap.add_argument("--elements", type=int, default=None, metavar="N",
                    help="--authenticated: the training processes' vector, float64 elements (default "
                         "384, 3 chunks; 131072, 1 MB, sends spread's sum round the ring of ranks)")
    args = ap.parse_args()
    if args.authenticated:
        raise SystemExit(asyncio.run(fuzz_authenticated(
            args.frames, args.batch or 2000, args.rate, args.timeout, args.seed, args.workdir,
            tuple(args.schemes.split(",")), args.restart_master, args.elements or ELEMENTS)))
    raise SystemExit(asyncio.run(fuzz(args.frames, args.batch or 200, args.seed, args.workdir)))


if __name__ == "__main__":
    main()
