"""What the tests share, each defined once (the fixtures themselves are in ``tests/conftest.py``):

- ``clients``: a training process's client on every named host of a real tree, and their close
- ``vectors``: per-sample gradients, a host's weighted share of them, the relative error
- ``waits``: waiting on state (never on sleeps), gather that cancels, a timed outcome
- ``trees``: the hosts of a tree that run training processes, the signal that kills a daemon
- ``certs``: a throwaway cluster CA and host certificates (``openssl``), for TLS tests
- ``peers``: a TCP peer speaking frames by hand, what an attacker (or a test) sends
- ``fake_links``: a stand-in for a Connection, for a node's rooms tested in-process
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]     # the clone: README.md, docs/, scripts/, examples/
TESTS = REPO / "tests"
