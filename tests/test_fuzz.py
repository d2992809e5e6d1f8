"""A bounded fuzz run against a live, authenticated tree (benchmarks/fuzz.py): no daemon
dies, memory stays bounded, every legitimate step between the batches is exact."""

import pytest

from benchmarks.fuzz import fuzz

pytestmark = pytest.mark.timeout(600)


async def test_twenty_thousand_hostile_frames_change_nothing(tmp_path, capsys):
    assert await fuzz(frames=20_000, batch=200, seed=1, workdir=str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "crashes 0; wrong results 0" in out
