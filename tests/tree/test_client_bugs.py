"""A bug in the client's own handling of crnetd's answers surfaces as itself (an
InternalError chaining the exception and its traceback), never as a daemon that went
away; and the test it happens in fails (conftest's ``client_bugs``)."""

import traceback

import pytest

from crnet import AsyncClient, DaemonNotRunning
from crnet.client.replies import Replies
from crnet.coding.plan import Tree
from crnet.errors import InternalError
from crnet.protocol import transport

pytestmark = pytest.mark.timeout(60)

TREE = Tree.regular(2, 1, 1)


def broken(*args):
    raise KeyError("injected")


@pytest.mark.parametrize("where", ["parse", "dispatch"])
async def test_a_bug_in_reading_the_daemons_answers_is_raised_as_itself(local_tree, monkeypatch,
                                                                        client_bugs, where):
    lt = local_tree(TREE, 4)
    c = await AsyncClient.connect(lt.socket_path("0"), timeout=30)
    try:
        # The daemon's answer then fails to parse, or its dispatch fails.
        if where == "parse":
            monkeypatch.setattr(transport, "parse", broken)
        else:
            monkeypatch.setattr(Replies, "received", broken)
        with pytest.raises(InternalError, match=r"crnet bug.*KeyError.*not at fault") as got:
            await c.stats()
        assert not isinstance(got.value, DaemonNotRunning)
        cause = got.value.__cause__
        assert isinstance(cause, KeyError) and cause.args == ("injected",)
        assert traceback.extract_tb(cause.__traceback__)[-1].name == "broken"
        # Every later request says the same, not that the daemon went away.
        with pytest.raises(InternalError) as again:
            await c.stats()
        assert again.value.__cause__ is cause
        # Logged once, with its traceback: the fixture would fail this test on it.
        assert [r.exc_info[1] for r in client_bugs if r.exc_info] == [cause]
        client_bugs.clear()
    finally:
        c.close()
    assert lt.alive("0")
