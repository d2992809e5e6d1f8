"""Issue 39 row 3: spread's ring of sums and a relay that holds the cluster secret.

A share of the sum larger than a paced link holds goes round the ring of ranks, each host
relaying it on (``crnet/schemes/spread/driver.py``). The hostile host here is a real
crnetd whose code was changed, as a compromised host's would be: it takes part in every
step as an honest host does (its pieces, the chunks it owns), but every chunk of the sum
it relays, it relays as 666s. An honest process of the tree must never get that as a
result.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients
from .test_trust import SAMPLES, STAR, exact, running, step
from .test_trust_fuzzed import shown

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]

DIM = 1 << 16       # float64: 512 KiB, four shares of 128 KiB, each relayed round the ring

# Run in the hostile daemon before crnet's CLI: its relayed copies are 666s.
FORGE = ("import crnet.schemes.spread.driver as d; "
         "exec('def _forged(self, st, chunk):\\n"
         "    a, b = st.layout.bounds(chunk)\\n"
         "    data = self.ports.memory.alloc(b - a, st.layout.dtype)\\n"
         "    data[:] = 666.0\\n"
         "    self._relay(st, chunk, data)\\n', d.__dict__); "
         "d.Spread._relay_copy = d._forged; ")


def forged(argv: list[str], change: str = FORGE) -> list[str]:
    """A daemon's command line (``crnet_argv``'s), run with ``change`` first."""
    return [*argv[:2], argv[2].replace("from crnet.cli import", change + "from crnet.cli import"),
            *argv[3:]]


def forging(name: str, change: str = FORGE):
    """A LocalTree spawn whose daemon ``name`` runs ``change`` first (relays forged chunks
    of the sum)."""
    def spawn(who, argv, kwargs):
        return subprocess.Popen(forged(argv, change) if who == name else argv, **kwargs)
    return spawn


async def test_a_relay_that_forges_the_sum_gives_no_honest_process_its_forgery(tmp_path):
    """Host 2 (rank 3) relays 666s for every chunk of the sum that passes it: owner rank
    1's chunks reach the master through it, owner rank 2's the master and host 0. Before
    the fix their processes got results with 666s in them, and the master settled the
    steps. Now each relayed chunk counts only once it matches its owner's digest (SUM_DIGEST,
    straight from the owner): every result any process gets is the exact sum."""
    grads = gradients(51, SAMPLES, DIM)
    want = grads.sum(axis=0)
    names = [MASTER, "0", "1", "2"]
    with running(tmp_path / "tree", STAR, SAMPLES, secret=True, scheme="spread",
                 spawn=forging("2")) as lt:
        clients = await connect_all(lt, names, starting=True)
        try:
            outcomes = {t: await step(clients, grads, t) for t in range(6)}
            wrong = {t: {n: o for n, o in got.items() if isinstance(o, np.ndarray)
                         and not exact({n: o}, want)} for t, got in outcomes.items()}
            assert not any(wrong.values()), shown({t: w for t, w in wrong.items() if w})
            assert "relayed does not match the owner's digest" in lt.log_path(MASTER).read_text()
            assert all(exact(outcomes[t], want) for t in range(2, 6)), shown(outcomes)
        finally:
            close_all(clients)


async def test_with_trust_relays_a_host_takes_the_relayed_sum_unchecked(tmp_path):
    """The other side of ``--trust-relays``: a host given it takes what is relayed to it
    unchecked, forgery included (the cost the option saves is that check), while its
    owners' digests still go out and the hosts without it refuse the forgery."""
    grads = gradients(52, SAMPLES, DIM)
    want = grads.sum(axis=0)
    names = [MASTER, "0", "1", "2"]

    def spawn(who, argv, kwargs):
        if who == "2":
            argv = forged(argv)
        if who == "0":                       # rank 1: after the master on owner 2's way
            argv = [*argv, "--trust-relays"]
        return subprocess.Popen(argv, **kwargs)
    with running(tmp_path / "tree", STAR, SAMPLES, secret=True, scheme="spread",
                 spawn=spawn) as lt:
        clients = await connect_all(lt, names, starting=True)
        try:
            outcomes = {t: await step(clients, grads, t) for t in range(4)}
            got = [outcomes[t]["0"] for t in range(4)]
            assert any(isinstance(o, np.ndarray) and (o == 666.0).any() for o in got), shown(outcomes)
            assert all(exact({n: outcomes[t][n]}, want) for t in range(2, 4) for n in (MASTER, "1"))
        finally:
            close_all(clients)


# Run in the hostile daemon: it relays nothing (its own chunks still go out).
SILENT = "import crnet.schemes.spread.driver as d; d.Spread._relay_copy = lambda self, st, c: None; "


async def test_a_relay_that_passes_nothing_on_costs_the_hosts_after_it_a_hop_not_their_steps(tmp_path):
    """Issue 39 row 3 (A): host 2 (rank 3) takes part in every step but relays nothing. The
    hosts after it on the ring never got the chunks it should have passed on: every step
    failed or was lost there, for as long as it ran (the master, which had the whole sum,
    never excluded it: it sent its pieces). Now a host that has an owner's digest of a
    chunk but not the chunk a while later asks the owner for it straight (SUM_WANTED)."""
    grads = gradients(53, SAMPLES, DIM)
    want = grads.sum(axis=0)
    names = [MASTER, "0", "1", "2"]

    with running(tmp_path / "tree", STAR, SAMPLES, secret=True, scheme="spread",
                 spawn=forging("2", SILENT)) as lt:
        clients = await connect_all(lt, names, starting=True)
        try:
            outcomes = {t: await step(clients, grads, t) for t in range(6)}
            honest = [n for n in names if n != "2"]
            assert all(exact({n: outcomes[t][n]}, want) for t in range(6) for n in honest), \
                shown(outcomes)
        finally:
            close_all(clients)


async def test_with_the_sum_sent_direct_no_host_relays_and_none_checks(tmp_path):
    """``--spread-sum direct`` at the master (where the CPUs bound a step): every owner
    sends its chunks of the sum to every host itself, so the forging daemon of the first
    test relays nothing (its change never runs) and no host hashes a relayed copy: every
    result exact from the first step, and no digest ever compared."""
    grads = gradients(54, SAMPLES, DIM)
    want = grads.sum(axis=0)
    names = [MASTER, "0", "1", "2"]
    with running(tmp_path / "tree", STAR, SAMPLES, secret=True, scheme="spread",
                 spread_sum="direct", spawn=forging("2")) as lt:
        clients = await connect_all(lt, names, starting=True)
        try:
            outcomes = {t: await step(clients, grads, t) for t in range(4)}
            assert all(exact(outcomes[t], want) for t in range(4)), shown(outcomes)
            logs = "".join(lt.log_path(n).read_text() for n in names)
            assert "digest" not in logs and "asked of its owner" not in logs
        finally:
            close_all(clients)
