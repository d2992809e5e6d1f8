"""Fuzz a live tree from inside: ``python -m benchmarks.fuzz --authenticated --frames 20000``.

The hostile peer holds the cluster secret. After a real handshake it takes real slots of a
tree of strict crnetd processes, slots whose hosts are left unstarted: an interior slot
(its whole subtree: it claims all of it joined) and a leaf slot under a real parent, in a
``--scheme cr`` tree and in a ``--scheme spread`` tree. In spread each slot is a host
with its own rank, as a compromised host is (``hostile_mesh.InsiderMesh``): it listens
where its HELLO says, accepts the other hosts' peer links, answers their checks of its
links truthfully and confirms theirs or not (or forges PEER_CHECKED and PEER_CONFIRMED on
them); so its links to every host, as its own rank, are confirmed and what it sends on
them reaches their engines. Now and then it also dials a host as another rank (such a
link may only ask; the rest closes it). On those links it sends what ``hostile_frames.Forger`` makes:
every message type a node may send (JOINED, OPEN, FAIL, CHUNK, BCAST, BARRIER, JOB,
WANT_STATE, STATUS_REPLY up the tree; PIECE for both phases, MOOT, OWNERS and SEGMENT
to peers), well-formed, with steps near, inside and far beyond the window, hostile
sizes, keys, counts and names, out-of-place frames, and replays of frames it saw or sent;
among them sums' pieces (GATHER) of steps ahead in well-formed layouts of its own choosing
(``Forger.own_layout``). When a daemon closes its link it authenticates and takes the slot
again, saying in JOINED that the tree decided nothing, the truth, or a step far ahead. With
``--restart-master K`` the master is killed and started again after every K batches: the
slots under it are taken again with those claims, which a restarted master weighs.

Meanwhile a training process on every other host (``fuzz_trainers.py``, a process of its
own) runs the README's loop with ``AsyncClient``. The hostile peer never sends a gradient
for a step it has not seen decided, so it can only be a straggler: the trees' codes
(fanout 3, s = 1 per layer) leave one child of every parent out. After every batch the
fuzzer prints one line; at the end a summary, and it exits 1 on a daemon that died or
logged a traceback, a wrong result, a wait past ``--timeout`` + grace (+1 s for the
trip and this busy machine) or a daemon's own timeout error, an error no hostile
straggler explains (JobEnded, ...), a tree that stopped (no process got a result for
three bounds at a check), or a daemon's RSS grown after warm-up by more than 10% (at
least 8 MiB). Failed, lost and refused steps are counted and shown: the threat
model promises none, but each ends within the bound.

A ring (``--scheme rar``) is not fuzzed this way: a ring waits for every member by
design (``schemes/ring_allreduce.py``), so a hostile member stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from crnet.coding.plan import Tree
from crnet.defaults import GRACE_MAX, GRACE_MIN, GRACE_SHARE
from crnet.protocol.auth import load_secret
from crnet.protocol.fields import MAX_STEP
from crnet.protocol.messages import (
    LINK_ID_BYTES,
    Barrier,
    Bcast,
    Fail,
    FailKind,
    Hello,
    Job,
    Joined,
    PeerConfirmed,
    PeerHello,
    Refuse,
    Result,
    WantState,
    Welcome,
)
from crnet.tools.launch import MASTER, LocalTree

from .hostile_frames import Forger, Known
from .hostile_mesh import InsiderMesh
from .hostile_peer import Peer, authenticate, dial

SAMPLES, ELEMENTS, CHUNK_BYTES = 60, 384, 1024   # 3 chunks of float64 a step
# With --elements, at least this many bytes a chunk: a vector of 1 MB is 16 chunks (spread's
# shares then go round the ring of ranks, the hostile host relaying on it: issue 39 row 3).
CHUNKS_LARGE = 16


def chunk_bytes_of(elements: int) -> int:
    return max(CHUNK_BYTES, elements * 8 // CHUNKS_LARGE)
LOG_LEVEL = os.environ.get("CRNET_FUZZ_LOG", "warning")   # the daemons'; info to debug
SLACK = 1.0                                      # seconds: the trip, on a busy 2-core machine
STATE_EXTRA = 5.0                                # seconds more a state request may wait
RSS_GROWTH = 0.10                                # after warm-up, beyond max(this, 8 MiB): growth


@dataclass(frozen=True)
class Scenario:
    scheme: str
    tree: Tree
    hostile: tuple[str, ...]    # slots the hostile peer takes (their subtrees stay unstarted)


SCENARIOS = (Scenario("cr", Tree.regular(3, 2, 1), ("2", "0.2")),
             Scenario("spread", Tree.regular(3, 2, 1), ("2", "0.2")))


def bound(timeout: float) -> float:
    """The longest any wait may take: --timeout, the grace after it (crnet.defaults), the trip."""
    return timeout + min(GRACE_MAX, max(GRACE_MIN, timeout * GRACE_SHARE)) + SLACK


def subtree(tree: Tree, name: str) -> list[str]:
    return [name] + [n for c in tree.children(name) for n in subtree(tree, c)]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)


class HostileHost:
    """One slot of the tree held by the hostile peer, and (spread) its links to every host."""

    def __init__(self, lt: LocalTree, name: str, real: list[str], secret: bytes, known: Known,
                 rng: random.Random):
        self.lt, self.name, self.real, self.secret, self.k = lt, name, real, secret, known
        self.forger = Forger(rng, known)
        self.rng = rng
        self.link: Peer | None = None
        self.peers: list[Peer] = []
        self.names = list(lt.tree.names())
        self.rank = self.names.index(name)
        # spread: its listener and its answers for its rank; its own links, by host
        self.mesh = InsiderMesh(secret, self.rank, confirm=0.9, rng=random.Random(rng.random()),
                                seen=known.seen.append) if lt.scheme == "spread" else None
        self.own: dict[str, Peer] = {}
        self.confirmed: set[Peer] = set()    # links whose rank the host confirmed
        self.confirmations = 0               # of them, all told
        self.on_confirmed = 0                # frames sent on them
        # One reader per link; a link's socket is closed only once its reader is done and
        # no write is under way on it (a closed descriptor still in the loop's selector
        # would be reused by the next dial's).
        self.readers: dict[Peer, asyncio.Task] = {}
        self.writing: Peer | None = None
        self.closed = 0          # links the daemons closed (each taken again)

    async def join(self, deadline: float) -> None:
        """Take the slot: HELLO, the proof, WELCOME; then JOINED for the whole subtree."""
        parent = self.lt.tree.parent(self.name)
        assert parent is not None
        if self.mesh is not None and not self.mesh.started:
            self.mesh.start()
        hello = Hello(name=self.name) if self.mesh is None else self.mesh.hello(self.name)
        while True:
            peer = await dial(self.lt.ports[parent])
            answer = await authenticate(peer, self.secret, hello)
            if isinstance(answer, Welcome):
                break
            peer.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the hostile peer could not take slot {self.name}: {answer}")
            await asyncio.sleep(0.2 if isinstance(answer, Refuse) and answer.retry else 0.5)
        self.k.job = answer.job
        self.k.decided = max(self.k.decided, answer.tree_step)
        # Where it says the tree is: nothing, the truth, or far ahead (a restarted master
        # takes children's word for it: issue 54 row 2).
        claim = self.rng.choice([-1, self.k.decided, self.k.decided + 5, 10 ** 6, MAX_STEP])
        await peer.write(b"".join(bytes(p) for p in Joined(self.k.subtree, claim, answer.job).frame()))
        self.link = peer
        self.readers[peer] = asyncio.ensure_future(self._read(peer))

    async def dial_peers(self) -> None:
        """spread: a link of its own rank to every real host it has none to (confirmed once
        the host asked its listener); now and then one claiming another rank."""
        assert self.mesh is not None
        for name in self.real:
            port, rank = self.lt.ports[name], self.names.index(name)
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                if name not in self.own:
                    peer = await self.mesh.dial(port, rank)
                    if peer is not None:
                        self.own[name] = peer
                        self._reading(peer)
                if self.rng.random() < 0.25:
                    await self._impersonate(port)

    async def _impersonate(self, port: int) -> None:
        """A link that claims any rank (its id nobody's): the host asks that rank, gets no."""
        claimed = self.rng.randrange(len(self.names))
        peer = await dial(port)
        try:
            hello = PeerHello(claimed, link_id=secrets.token_bytes(LINK_ID_BYTES))
            answer = await authenticate(peer, self.secret, hello)
        except (OSError, asyncio.TimeoutError):
            answer = None
        if answer is None or isinstance(answer, Refuse):
            peer.close()
        else:
            self._reading(peer)

    def _reading(self, peer: Peer) -> None:
        self.peers.append(peer)
        self.readers[peer] = asyncio.ensure_future(self._read(peer))

    async def _read(self, peer: Peer) -> None:
        """Take in what the daemon sends: what it says of the tree, frames to replay."""
        k = self.k
        try:
            while (got := await peer.recv_frame(timeout=3600)) is not None:
                msg, _, raw = got
                k.seen.append(raw)
                if isinstance(msg, Result) or (isinstance(msg, Fail) and msg.kind is FailKind.TREE):
                    k.decided = max(k.decided, msg.step)
                    if not k.done or k.done[-1] != msg.step:
                        k.done.append(msg.step)
                elif isinstance(msg, (Bcast, Barrier)):
                    k.keys.add(msg.key)
                elif isinstance(msg, WantState):
                    k.nonces.append(msg.nonce)
                    del k.nonces[:-16]
                elif isinstance(msg, Job):
                    k.job = msg.name
                elif isinstance(msg, PeerConfirmed):
                    self.confirmed.add(peer)
                    self.confirmations += 1
        except (OSError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            self._forget(peer)
            del self.readers[peer]
            if peer is not self.writing:
                peer.close()

    def _forget(self, peer: Peer) -> None:
        if peer is self.link:
            self.link = None
        if peer in self.peers:
            self.peers.remove(peer)
        self.confirmed.discard(peer)
        for name, own in list(self.own.items()):
            if own is peer:
                del self.own[name]

    async def burst(self, frames: int, rate: float, deadline: float) -> None:
        """Send ``frames`` frames at about ``rate`` a second, taking the slot again when
        the daemon closes the link."""
        start = time.monotonic()
        for i in range(frames):
            if self.link is None:
                self.closed += 1
                await self.join(deadline)
            if self.mesh is not None and len(self.own) < len(self.real) and i % 16 == 0:
                await self.dial_peers()
            r = self.rng.random()
            if self.mesh is not None and r < 0.02:    # on a host's link to it: forged answers
                await self.mesh.send(self.forger.answer())
            elif self.peers and r < 0.35:
                # Mostly on a confirmed link, where its pieces count; else on one the host
                # is still checking (or that claims another rank), where they close it.
                links = list(self.confirmed) if self.confirmed and r < 0.3 else self.peers
                await self._send(self.rng.choice(links), self.forger.peer())
            elif self.link is not None:   # (else closed meanwhile: taken again next)
                await self._send(self.link, self.forger.up())
            if i % 8 == 7:
                await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))

    async def _send(self, target: Peer, data: bytes) -> None:
        self.on_confirmed += target in self.confirmed
        self.writing = target
        ok = await target.write(data, within=5.0)
        self.writing = None
        if target not in self.readers:      # its reader is done: closed by the daemon
            target.close()
        elif not ok:
            self._forget(target)
            self.readers[target].cancel()   # which closes it

    async def close(self) -> None:
        readers = dict(self.readers)
        for task in readers.values():
            task.cancel()                       # each closes its link
        # Bounded: a run once hung here at its end (not understood yet); what is left is
        # closed here, its reader cancelled already.
        if readers:
            await asyncio.wait(readers.values(), timeout=5)
        for peer, task in readers.items():
            if not task.done():
                peer.close()
        if self.mesh is not None:
            await self.mesh.close()


@dataclass
class Tally:
    """What the training processes saw."""

    bound: float
    outcomes: Counter = field(default_factory=Counter)
    max_wait: float = 0.0
    newest: dict[str, int] = field(default_factory=dict)
    last_exact: float = field(default_factory=time.monotonic)   # when a result last came
    results: set[int] = field(default_factory=set)   # steps with a result since the last batch
    stalls: int = 0                                  # checks that found none for 3 bounds
    bad: list[str] = field(default_factory=list)     # wrong results, waits past the bound, errors

    def take(self, line: dict) -> None:
        outcome, wait = line["outcome"], line["wait"]
        self.outcomes[outcome] += 1
        self.max_wait = max(self.max_wait, wait)
        if outcome == "exact":
            self.newest[line["host"]] = max(self.newest.get(line["host"], -1), line["step"])
            self.last_exact = time.monotonic()
            self.results.add(line["step"])
        what = f"{line['host'] or 'master'} step {line['step']}: {outcome} after {wait:.2f} s {line['what']}"
        # A state request waits for another process's answer: its bound is 5 s longer
        # (docs/client.md); every other call's is the daemon's.
        late = wait > self.bound + (STATE_EXTRA if outcome in ("resync", "no state") else 0.0)
        if outcome in ("wrong", "timeout", "error") or late:
            if late:
                self.outcomes["past bound"] += 1
            self.bad.append(what)
            print("  BAD " + what, flush=True)

    @property
    def decided(self) -> int:
        return max(self.newest.values(), default=-1)


async def run_scenario(sc: Scenario, frames: int, batch: int, rate: float, timeout: float,
                       seed: int, workdir: str | None, restart_master: int = 0,
                       elements: int = ELEMENTS) -> bool:
    """One tree under the hostile peer; True if nothing went wrong. ``restart_master``: the
    master is killed and started again after every that many batches (0: never); the
    hostile slots under it take them again, with claims of where the tree is."""
    hostile = {n for h in sc.hostile for n in subtree(sc.tree, h)}
    real = [n for n in sc.tree.names() if n not in hostile]
    lt = LocalTree(sc.tree, SAMPLES, workdir=workdir, secret=True, log_level=LOG_LEVEL, strict=True,
                   scheme=sc.scheme, timeout=timeout, chunk_bytes=chunk_bytes_of(elements))
    tally = Tally(bound(timeout))
    hosts: list[HostileHost] = []
    trainers = None
    rng = random.Random(seed)
    problems: list[str] = []
    print(f"\n--scheme {sc.scheme}, tree {sc.tree}: hostile slots {', '.join(sc.hostile)} "
          f"(unstarted: {', '.join(sorted(hostile - set(sc.hostile))) or 'none'}); real hosts "
          f"{', '.join(LocalTree.filename(n) for n in real)}; bound {tally.bound:.2f} s", flush=True)
    try:
        for name in real:
            lt.start_node(name)
        lt.wait_sockets(real, 30)
        secret = load_secret(lt.options["secret_file"])
        for h in sc.hostile:
            known = Known(elements, "float64", chunk_bytes_of(elements), 16,
                          len(subtree(sc.tree, h)), len(real), tuple(sc.tree.names()))
            hosts.append(HostileHost(lt, h, real, secret, known, random.Random(rng.random())))
        spec = {"sockets": {n: lt.socket_path(n) for n in real}, "samples": SAMPLES,
                "elements": elements, "processes": len(real)}
        trainers = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.fuzz_trainers", json.dumps(spec),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        reader = asyncio.ensure_future(_tally(trainers, tally, lt.workdir / "trainers.jsonl"))
        deadline = time.monotonic() + 60
        for host in hosts:
            await host.join(deadline)
            if sc.scheme == "spread":
                await host.dial_peers()
        while tally.decided < 3:            # the tree runs: every host got a result
            if time.monotonic() > deadline or reader.done():
                raise RuntimeError("no step was decided within 60 s of the start")
            await asyncio.sleep(0.1)
        sent, started, warm, rss, restarts = 0, time.monotonic(), None, {}, 0
        batches = max(1, -(-frames // batch))
        for b in range(batches):
            n = min(batch, frames - sent)
            for host in hosts:
                host.k.decided = max(host.k.decided, tally.decided)
                host.k.done.extend(tally.results)
            tally.results.clear()
            await asyncio.gather(*(h.burst(n // len(hosts), rate / len(hosts), time.monotonic() + 60)
                                   for h in hosts))
            sent += n // len(hosts) * len(hosts)
            if restart_master and (b + 1) % restart_master == 0 and b + 1 < batches:
                lt.signal(MASTER, signal.SIGKILL)
                lt.start_node(MASTER)
                lt.wait_sockets([MASTER], 30)
                restarts += 1
                if warm is not None:
                    warm.pop(MASTER, None)   # a new process: its own warm-up
            dead = [LocalTree.filename(n) for n in real if not lt.alive(n)]
            if dead or reader.done():
                problems.append(f"died: {', '.join(dead) or 'the training processes'}")
                break
            rss = {n: rss_kib(lt.procs[n].pid) for n in real}
            if time.monotonic() - tally.last_exact > 3 * tally.bound:   # the tree stopped
                tally.stalls += 1
                print(f"  STALLED: no result for {time.monotonic() - tally.last_exact:.0f} s", flush=True)
            if warm is None and (b + 1 >= min(3, batches // 10 + 1)):
                warm = dict(rss)
            elif warm is not None and MASTER not in warm and MASTER in rss and not (
                    restart_master and (b + 1) % restart_master == 0):
                warm[MASTER] = rss[MASTER]   # a batch after its restart
            o = tally.outcomes
            print(f"{sent:>9} frames {time.monotonic() - started:7.1f} s  steps {tally.decided:>6}  "
                  f"exact {o['exact']} wrong {o['wrong']} failed {o['failed']} lost {o['lost']} "
                  f"refused {o['refused']} past bound {o['past bound']}  max wait {tally.max_wait:.2f} s  "
                  f"relinks {sum(h.closed for h in hosts)}  RSS max {max(rss.values()) / 1024:.1f} MiB",
                  flush=True)
        await asyncio.sleep(2 * timeout)    # the last steps' answers are in
        if time.monotonic() - tally.last_exact > 3 * tally.bound:   # stopped at the end
            tally.stalls += 1
            print(f"  STALLED: no result for {time.monotonic() - tally.last_exact:.0f} s", flush=True)
    finally:
        for host in hosts:
            await host.close()
        if trainers is not None:
            # (A tree that stopped leaves its processes waiting on a step: killed then.)
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                trainers.stdin.close()          # type: ignore[union-attr]
                await asyncio.wait_for(trainers.wait(), 30)
            if trainers.returncode is None:
                trainers.kill()
                await trainers.wait()
        lt.stop()
        problems += lt.problems()
    if trainers is not None and trainers.returncode:
        problems.append(f"the training processes exited with {trainers.returncode}")
    o = tally.outcomes
    print(f"{sc.scheme}: {sent} hostile frames in {time.monotonic() - started:.1f} s; steps to "
          f"{tally.decided}: exact {o['exact']}, wrong {o['wrong']}, failed {o['failed']}, lost "
          f"{o['lost']}, refused {o['refused']}, resyncs {o['resync']} (unanswered {o['no state']}), "
          f"timeouts {o['timeout']}, errors "
          f"{o['error']}; waits past the bound ({tally.bound:.2f} s) {o['past bound']}, longest "
          f"{tally.max_wait:.2f} s; links taken again {sum(h.closed for h in hosts)}; master "
          f"restarts {restarts}")
    if sc.scheme == "spread":
        print("  peer links: " + "; ".join(
            f"slot {h.name} (rank {h.rank}) confirmed {h.confirmations} of its own, frames on "
            f"them {h.on_confirmed}, checks answered yes {h.mesh.answers[True]} no {h.mesh.answers[False]}"
            for h in hosts if h.mesh is not None))
    grown = []
    for name in real:
        w, e = (warm or rss).get(name, 0), rss.get(name, 0)
        flag = e - w > max(8 << 10, RSS_GROWTH * w)
        grown += [LocalTree.filename(name)] if flag else []
        print(f"  {LocalTree.filename(name):8} RSS warm {w / 1024:6.1f} -> end {e / 1024:6.1f} MiB"
              f"{'  GREW' if flag else ''}")
    problems += [f"RSS grew: {', '.join(grown)}"] if grown else []
    problems += [f"the tree stopped: no result at {tally.stalls} checks"] if tally.stalls else []
    for p in problems:
        print("PROBLEM " + p, file=sys.stderr)
    return not problems and not tally.bad and o["exact"] > 0


async def _tally(proc, tally: Tally, keep: Path) -> None:
    """Count what the training processes say, and keep it (``trainers.jsonl`` in the workdir)."""
    with open(keep, "ab") as f:
        while line := await proc.stdout.readline():
            f.write(line)
            with contextlib.suppress(ValueError):
                tally.take(json.loads(line))


async def fuzz_authenticated(frames: int, batch: int = 2000, rate: float = 400.0, timeout: float = 2.0,
                             seed: int = 0, workdir: str | None = None,
                             schemes: tuple[str, ...] = ("cr", "spread"),
                             restart_master: int = 0, elements: int = ELEMENTS) -> int:
    """Every scenario of ``schemes`` with its share of ``frames``; 0 if nothing went wrong, else 1."""
    ok = True
    chosen = [sc for sc in SCENARIOS if sc.scheme in schemes]
    for i, sc in enumerate(chosen):
        sub = None if workdir is None else f"{workdir}/{sc.scheme}"
        ok &= await run_scenario(sc, frames // len(chosen), batch, rate, timeout, seed + i, sub,
                                 restart_master, elements)
    verdict = "no crash, no wrong result, no wait past the bound, RSS flat" if ok else "FAILED"
    print(f"\nauthenticated fuzzing: {verdict}")
    return 0 if ok else 1
