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
# tests/trust/test_trust.py (on uvloop the training processes were never told to stop).
@pytest.mark.asyncio(loop_factories=["asyncio"])
@pytest.mark.parametrize("scheme", ["cr", "spread"])
async def test_ten_thousand_frames_from_a_secret_holder_in_two_slots_leave_every_result_exact(
        tmp_path, capsys, scheme):
    """The authenticated fuzzer (benchmarks/fuzz_authenticated.py), short: a peer that holds
    the cluster secret in an interior and a leaf slot, while the other hosts' processes run
    the README's loop. In a cr tree it is only a straggler: not one step fails either.

    In spread its peer links are confirmed for its own ranks (``benchmarks/hostile_mesh.py``):
    it is a member of the tree, and still only a straggler."""
    code = await fuzz_authenticated(frames=10_000, batch=2000, rate=800, seed=1,
                                    workdir=str(tmp_path), schemes=(scheme,))
    out, err = capsys.readouterr()
    problems = [line for line in err.splitlines() if line.startswith("PROBLEM")]
    assert "wrong 0" in out and "  BAD " not in out, out
    assert code == 0 and "no crash, no wrong result" in out and not problems, out + err
    assert "wrong 0, failed 0, lost 0, refused 0" in out, out
