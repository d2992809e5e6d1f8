"""Typed messages: each one survives the wire; every bad field is a ProtocolError that names it."""

import re

import msgpack
import pytest

from crnet.coding.plan import Tree, plan
from crnet.errors import (
    DaemonBusy,
    ErrorKind,
    MismatchError,
    ProtocolError,
    RequestRejected,
    StepFailed,
    StepLost,
    StepRefused,
)
from crnet.protocol.allocation import NodeShare, pack_allocation, parse_allocation
from crnet.protocol.fields import MAX_REASON
from crnet.protocol.messages import (
    CLASSES,
    Assign,
    Attach,
    Attached,
    Barrier,
    Bcast,
    Challenge,
    Chunk,
    ClientError,
    ClientHello,
    ClientWelcome,
    Decided,
    Delivered,
    Done,
    Fail,
    FailKind,
    Fetch,
    Heartbeat,
    Hello,
    Job,
    Joined,
    Message,
    Move,
    Open,
    PeerCheck,
    PeerChecked,
    PeerConfirmed,
    PeerHello,
    PeerWelcome,
    Probe,
    ProbeEcho,
    Proof,
    Publish,
    Receive,
    Refuse,
    Result,
    RingPlace,
    StatsReply,
    StatsRequest,
    StatusHello,
    StatusReply,
    StatusRequest,
    Submit,
    WantState,
    Watch,
    Welcome,
    before_auth,
    parse,
    vote_key,
)
from crnet.protocol.wire import FrameReader, MsgType
from crnet.schemes.ring_allreduce.messages import Phase, Segment
from crnet.schemes.spread.messages import Moot, Owners, Piece, Settled, SumDigest, SumWanted

INT64_MAX = (1 << 63) - 1

EVERY_MESSAGE = [
    Hello(),
    Hello("0.1", "10.0.0.2:7000"),
    Welcome("1.0", 2, (3, 2), (1, 0), "crc", 4096, "cr"),
    Welcome("1.0", 2, (3, 2), (1, 0), "crc", 4096, "cr", 41, 1000, "float32"),
    Welcome("1.0", 2, (3, 2), (1, 0), "crc", 4096, "cr", 41, None, None, "", 1, "approximate", 0.25),
    Welcome("1.0", 2, (3, 2), (1, 0), "crc", 4096, "spread", spread_sum="direct"),
    Refuse("all 3 child slots taken"),
    Refuse("the parent has not joined yet", retry=True),
    Refuse("the tree moved this host", retry=True, to="10.0.0.4:7070", name="1.0"),
    Move((("0", "0", None, "10.0.0.1:7070"), ("0.0", "1", None, "10.0.0.4:7070"),
          ("1.1", "0.0", "10.0.0.1:7070", None))),
    Joined(5),
    Joined(5, 41),
    Joined(3, 41, "job", (("0.0", "10.0.0.4:7000"), ("0.1", "10.0.0.5:7000"))),
    Joined(3, 41, "", (), (), 1000, "float32"),       # the tree's vector, as the child knows it
    Assign(60),
    Assign(60, RingPlace(1, 3, "10.0.0.3:7000")),
    Assign(60, None, (None, "10.0.0.2:7000", "10.0.0.3:7000")),
    Chunk(3, 1, 100, "float32"),
    Chunk(3, 1, 100, "float32", (17.5, 0.25)),      # beyond s: (effective mass, residual)
    Result(INT64_MAX, 0, 1, "float64"),
    Result(4, 0, 1, "float64", (0.75, 1.0)),         # beyond s: (coverage, residual)
    *(Fail(3, f"a FAIL of kind {kind.value}", kind) for kind in FailKind),
    Open(INT64_MAX),
    PeerHello(2),
    PeerWelcome(),
    PeerConfirmed(),
    Heartbeat(),
    PeerCheck(b"i" * 16),
    PeerChecked(b"i" * 16, True),
    PeerChecked(b"i" * 16, False),
    Segment(4, Phase.GATHER, 1, 2, 100, "float64"),
    Segment(4, Phase.REDUCE, 0, 1, 100, "float64", 3),
    Piece(4, Phase.REDUCE, 7, 100, "float32"),
    Piece(INT64_MAX, Phase.GATHER, 0, 1, "float64"),
    Owners(0, 0),
    Owners(3, 41, (2, 7)),
    Moot(7, 3, 1000, "float32"),
    Settled(7, 1000, "float32"),
    SumDigest(7, 3, 1000, "float32", bytes(range(16))),
    SumWanted(7, 3, 1000, "float32"),
    ClientHello(4321),
    ClientWelcome({"name": "0", "layer": 1, "samples": 60, "workers": 3,
                   "ranges": ((0, 20, 1.0), (40, 45, -0.5))}, -1, 37.5),
    Attach("0123456789abcdef0123456789abcdef", 1 << 20),
    Attached(),
    Submit(7, 100, "float32"),
    Fetch(7, 100, "float64"),
    Done(7, 9),
    Done(7, 9, (0.5, 1.0)),
    ClientError("another training process is attached", ErrorKind.BUSY),
    ClientError("master did not get 2 of 3 children", ErrorKind.FAILED, 11, 10, True),
    ClientError("node 0 got no decision about step 11", ErrorKind.FAILED, 11, 10, False),
    ClientError("step 99 is more than 16 steps ahead", ErrorKind.REFUSED, 99, 10),
    StatsRequest(),
    Watch(7),
    Job("run-7"),
    Decided(7, 7),
    Bcast("params/0", 12345, -1, 1 << 20, 1 << 19, "float32"),
    Bcast("state/77", 1, 41, 0, 10, "float64"),
    WantState(77),
    Barrier("start", 1, 13),
    Barrier("start", 13, 13),
    Barrier(vote_key("params/0"), 3, 13, ("0.1",)),
    Barrier(vote_key("params/0"), 13, 13, ("0.1", "2")),
    Hello("0.1", "10.0.0.2:7000", None, "gpu-host-07"),
    StatusHello(),
    StatusHello(b"n" * 32),
    StatusRequest(3, 2.1),
    StatusRequest(3, 2.1, 64),
    StatusRequest(3, 2.1, 64, 4 << 20),
    Probe(5, 2, last=True),
    ProbeEcho(5, 2),
    StatusReply(0, {"name": "0", "host": "h", "address": "10.0.0.2:7000", "state": "joined",
                    "tree_step": 4, "steps_done": 5, "last_step_seconds": 0.25, "straggled": 1,
                    "recent": 5, "measured": None, "children": [
                        {"name": "0.0", "host": None, "address": None, "state": "missing",
                         "tree_step": -1, "steps_done": 0, "last_step_seconds": None,
                         "straggled": None, "recent": None, "measured": None,
                         "children": []}]}),
    Hello("0.1", "10.0.0.2:7000", b"n" * 32),
    PeerHello(2, b"n" * 32),
    PeerHello(2, b"n" * 32, b"i" * 16),
    Challenge(b"n" * 32, b"m" * 32),
    Proof(b"m" * 32),
    Publish("params/0", -1, 100, "float32"),
    Publish("state/77", 41, 100, "float64"),
    Publish("params/1", -1, 100, "float32", 0),
    Receive("params/0", 100, "float32"),
    Receive("params/1", 100, "float32", None, 12),
    Delivered("state/77", 41),
    StatsReply({"steps_done": 3, "decode_seconds": 0.5}, "0", "assigned", 2, (3, 4),
               {"parent": True, "children": [True, False]}),
]


def through_the_wire(msg, payload=None):
    """Frame ``msg``, read it back with a FrameReader, parse it: (message, payload bytes)."""
    got = []
    reader = FrameReader(lambda t, h, n: memoryview(bytearray(n)),
                         lambda t, h, p: got.append((t, h, p)))
    data = b"".join(bytes(part) for part in msg.frame(payload))
    reader.get_buffer(-1)[:len(data)] = data
    reader.buffer_updated(len(data))
    [(msg_type, header, body)] = got
    nbytes = 0 if body is None else len(body)
    return parse(msg_type, header, nbytes), None if body is None else bytes(body)


def test_every_message_type_has_a_case_here():
    assert {m.TYPE for m in EVERY_MESSAGE} == set(MsgType)


def test_every_wire_type_has_its_registered_class():
    assert set(CLASSES) == set(MsgType)
    assert all(cls.TYPE is t for t, cls in CLASSES.items())
    assert {type(m) for m in EVERY_MESSAGE} == set(CLASSES.values())


def test_only_the_hellos_and_the_proof_come_before_authentication():
    assert before_auth() == {MsgType.HELLO, MsgType.PEER_HELLO, MsgType.PROOF, MsgType.STATUS_HELLO}


def test_a_second_class_for_a_wire_type_is_refused():
    with pytest.raises(TypeError, match="both DONE"):
        class Twice(Message):
            TYPE = MsgType.DONE


def test_every_fail_kind_has_a_case_here():
    assert {m.kind for m in EVERY_MESSAGE if isinstance(m, Fail)} == set(FailKind)


@pytest.mark.parametrize("msg", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    payload = b"\x01\x02\x03\x04\x05\x06\x07\x08" if msg.PAYLOAD else None
    got, body = through_the_wire(msg, payload)
    assert type(got) is type(msg)
    assert got == msg
    assert body == payload


def test_a_long_reason_is_cut_to_the_limit():
    got, _ = through_the_wire(Fail(1, "x" * (MAX_REASON + 100)))
    assert got.reason == "x" * MAX_REASON


def test_a_missing_retry_means_no_retry():
    assert parse(MsgType.REFUSE, {"reason": "full"}, 0) == Refuse("full", False)


def piece(**fields):
    return {"step": 1, "chunk": 0, "total": 10, "dtype": "float32", **fields}


def segment(**fields):
    return {"step": 1, "phase": "rs", "round": 0, "segment": 0, "total": 10, "dtype": "float32",
            **fields}


def welcome(**fields):
    return {"name": "0", "layer": 1, "fanout": [3], "stragglers": [1], "code": "auto",
            "chunk_bytes": 4096, "scheme": "cr", "tree_step": -1, **fields}


def stats_reply(**fields):
    return {"stats": {}, "name": None, "state": "joining", "tree_step": -1,
            "open_steps": [], "links": {}, **fields}


def fail(**fields):
    return {"step": 1, "reason": "x", "kind": "tree", **fields}


def client_welcome(**fields):
    return {"assignment": {"name": "0", "layer": 1, "samples": 10, "workers": 3, "ranges": []},
            "tree_step": -1, "answer_within": 35.0, **fields}


BAD_FIELDS = [
    # addresses a node would dial (issue 26, row 12)
    (MsgType.JOINED, {"workers": 1, "tree_step": -1, "peers": [["0.1", "10.0.0.2:notaport"]]}, 0,
     "JOINED: field 'peers': '10.0.0.2:notaport' is not host:port with a port in 1..65535"),
    (MsgType.ASSIGN, {"samples": 10, "peers": [None, "a host:7000"]}, 8,
     "ASSIGN: field 'peers': 'a host:7000': 'a host' is neither a host name nor an IP address"),
    (MsgType.ASSIGN, {"samples": 10, "ring": {"rank": 0, "size": 3, "successor": "h:0"}}, 8,
     "ASSIGN ring: field 'successor': 'h:0' is not host:port with a port in 1..65535"),
    # wrong types: a string, a bool, a float where an integer goes
    (MsgType.JOINED, {"workers": "3"}, 0,
     "JOINED: field 'workers' must be an integer in 0..2147483648, got '3'"),
    (MsgType.CHUNK, piece(step=True), 8,
     f"CHUNK: field 'step' must be an integer in 0..{INT64_MAX}, got True"),
    (MsgType.DONE, {"step": 1.0, "tree_step": 0}, 0,
     f"DONE: field 'step' must be an integer in 0..{INT64_MAX}, got 1.0"),
    (MsgType.SUBMIT, {"step": 1, "dtype": "float32"}, 0,
     "SUBMIT: field 'length' must be an integer in 1..1099511627776, got '<missing>'"),
    (MsgType.FAIL, fail(reason=42), 0, "FAIL: field 'reason' must be a string, got 42"),
    (MsgType.REFUSE, {"reason": "full", "retry": 1}, 0,
     "REFUSE: field 'retry' must be true or false, got 1"),
    (MsgType.PEER_CHECK, {"link_id": b"i" * 15}, 0, "PEER_CHECK: field 'link_id' must be 16 bytes"),
    (MsgType.PEER_HELLO, {"rank": 1, "link_id": "i" * 16}, 0,
     "PEER_HELLO: field 'link_id' must be 16 bytes"),
    # steps out of range
    (MsgType.FAIL, fail(step=-1), 0,
     f"FAIL: field 'step' must be an integer in 0..{INT64_MAX}, got -1"),
    (MsgType.OPEN, {"step": -1}, 0, f"OPEN: field 'step' must be an integer in 0..{INT64_MAX}"),
    (MsgType.WELCOME, {k: v for k, v in welcome().items() if k != "tree_step"}, 0,
     f"WELCOME: field 'tree_step' must be an integer in -1..{INT64_MAX}, got '<missing>'"),
    (MsgType.WELCOME, welcome(tree_step=-2), 0,
     f"WELCOME: field 'tree_step' must be an integer in -1..{INT64_MAX}, got -2"),
    (MsgType.JOINED, {"workers": 1, "tree_step": -2}, 0,
     f"JOINED: field 'tree_step' must be an integer in -1..{INT64_MAX}, got -2"),
    (MsgType.DONE, {"step": 1, "tree_step": -2}, 0, "DONE: field 'tree_step' must be an integer"),
    (MsgType.ERROR, {"reason": "r", "kind": "failed", "tree_step": "3"}, 0,
     "ERROR: field 'tree_step' must be an integer in -1.."),
    (MsgType.ERROR, {"reason": "r", "kind": "failed", "tree_step": 3, "tree_wide": 1}, 0,
     "ERROR: field 'tree_wide' must be true or false, got 1"),
    (MsgType.STATS_REPLY, stats_reply(tree_step=None), 0,
     "STATS_REPLY: field 'tree_step' must be an integer in -1.."),
    (MsgType.CLIENT_WELCOME, client_welcome(answer_within=-1), 0,
     "CLIENT_WELCOME: field 'answer_within' must be a number in 0..1e+07, got -1"),
    (MsgType.CLIENT_WELCOME, client_welcome(answer_within=True), 0,
     "CLIENT_WELCOME: field 'answer_within' must be a number in 0..1e+07, got True"),
    (MsgType.WELCOME, welcome(total=0, dtype="float32"), 0,
     "WELCOME: field 'total' must be an integer in 1..1099511627776, got 0"),
    (MsgType.WELCOME, welcome(total=10, dtype="int8"), 0,
     "WELCOME: field 'dtype' must be one of float32, float64, got 'int8'"),
    (MsgType.RESULT, piece(step=1 << 63), 8,
     f"RESULT: field 'step' must be an integer in 0..{INT64_MAX}, got {1 << 63}"),
    (MsgType.SEGMENT, segment(step=-5), 8, "SEGMENT: field 'step' must be an integer"),
    (MsgType.CHUNK, piece(total=0), 8, "CHUNK: field 'total' must be an integer in 1..1099511627776"),
    # unknown names
    (MsgType.CHUNK, piece(dtype="float16"), 8,
     "CHUNK: field 'dtype' must be one of float32, float64, got 'float16'"),
    (MsgType.FETCH, {"step": 1, "length": 4, "dtype": "int8"}, 0,
     "FETCH: field 'dtype' must be one of float32, float64"),
    (MsgType.WELCOME, welcome(scheme="allgather"), 0,
     "WELCOME: field 'scheme' must be one of cr, gc, tree, rar, spread, got 'allgather'"),
    (MsgType.WELCOME, welcome(code="lt"), 0,
     "WELCOME: field 'code' must be one of auto, frc, crc, got 'lt'"),
    (MsgType.SEGMENT, segment(phase="xx"), 8, "SEGMENT: field 'phase' must be one of rs, ag"),
    (MsgType.ERROR, {"reason": "r", "kind": "oops"}, 0,
     "ERROR: field 'kind' must be one of failed, lost, refused, job, mismatch, busy, request, shm"),
    (MsgType.FAIL, fail(kind="mismatch!"), 0,
     "FAIL: field 'kind' must be one of tree, local, stall, mismatch, refused, lost"),
    (MsgType.FAIL, {"step": 1, "reason": "x"}, 0,
     "FAIL: field 'kind' must be a string of at most 256 characters, got '<missing>'"),
    # strings over their limit
    (MsgType.HELLO, {"name": "x" * 257}, 0,
     "HELLO: field 'name' must be a string of at most 256 characters, got 'xxxx"),
    (MsgType.HELLO, {"listen": 7000}, 0,
     "HELLO: field 'listen' must be a string of at most 256 characters, got 7000"),
    (MsgType.ATTACH, {"token": "t" * 65, "capacity": 8}, 0,
     "ATTACH: field 'token' must be a string of at most 64 characters"),
    # nested fields are named with their parent message
    (MsgType.ASSIGN, {"samples": 60, "ring": [0, 3]}, 8, "ASSIGN: field 'ring' must be a map"),
    (MsgType.ASSIGN, {"samples": 60, "ring": {"rank": 3, "size": 3}}, 8,
     "ASSIGN ring: field 'rank' must be an integer in 0..1, got 3"),
    (MsgType.ASSIGN, {"samples": 0}, 8, "ASSIGN: field 'samples' must be an integer in 1.."),
    (MsgType.CLIENT_WELCOME, client_welcome(assignment={"name": "0", "layer": "1"}), 0,
     "CLIENT_WELCOME assignment: field 'samples' must be an integer"),
    (MsgType.STATS_REPLY, stats_reply(open_steps=[1, "2"]), 0,
     "STATS_REPLY: field 'open_steps' must be a list of integers"),
    (MsgType.STATS_REPLY, stats_reply(links=None), 0, "STATS_REPLY: field 'links' must be a map"),
    (MsgType.WELCOME, welcome(fanout=[]), 0,
     "WELCOME: field 'fanout' must be a list of 1..16 integers in 1..65536, got []"),
    # unhashable values where the hot path looks a name up (a TypeError would have been
    # taken for a bug in crnet, and in strict mode stopped the daemon)
    (MsgType.CHUNK, piece(dtype=["float32"]), 8,
     "CHUNK: field 'dtype' must be a string of at most 256 characters, got ['float32']"),
    (MsgType.RESULT, piece(dtype={"a": 1}), 8, "RESULT: field 'dtype' must be a string"),
    (MsgType.SEGMENT, segment(dtype=["float32"]), 8, "SEGMENT: field 'dtype' must be a string"),
    (MsgType.SEGMENT, segment(phase=["rs"]), 8, "SEGMENT: field 'phase' must be a string"),
    # beyond s
    (MsgType.RESULT, piece(approx=[0.5]), 8, "RESULT: field 'approx' must be [mass or coverage, residual]"),
    (MsgType.CHUNK, piece(approx=[0.5, "x"]), 8, "CHUNK: field 'approx' must be [mass or coverage"),
    (MsgType.CHUNK, piece(approx=[float("nan"), 0.0]), 8, "CHUNK: field 'approx' must be"),
    (MsgType.DONE, {"step": 1, "tree_step": 0, "approx": "x"}, 0, "DONE: field 'approx' must be"),
    (MsgType.WELCOME, welcome(patience=-1.0), 0, "WELCOME: field 'patience' must be a number"),
    (MsgType.WELCOME, welcome(beyond_s="maybe"), 0, "WELCOME: field 'beyond_s' must be"),
    (MsgType.WELCOME, welcome(spread_sum="star"), 0, "WELCOME: field 'spread_sum' must be"),
    # a vote's roots: at most two tree names
    (MsgType.BARRIER, {"key": "k", "arrived": 1, "processes": 2, "roots": ["0", "1", "2"]}, 0,
     "BARRIER: field 'roots' must be a list of at most 2 tree names"),
    (MsgType.BARRIER, {"key": "k", "arrived": 1, "processes": 2, "roots": "0"}, 0,
     "BARRIER: field 'roots' must be a list"),
]


@pytest.mark.parametrize("msg_type, header, nbytes, message", BAD_FIELDS,
                         ids=[f"{t.name}-{m.split('field ')[-1][:20]}" for t, _, _, m in BAD_FIELDS])
def test_a_bad_field_is_a_protocol_error_naming_the_message_and_field(msg_type, header, nbytes,
                                                                      message):
    with pytest.raises(ProtocolError, match=r"^" + re.escape(message)):
        parse(msg_type, header, nbytes)


def test_a_bad_range_in_client_welcome_names_client_welcome():
    header = client_welcome(assignment={"name": "0", "layer": 1, "samples": 10, "workers": 3,
                                        "ranges": [[5, 11, 1.0]]})
    with pytest.raises(ProtocolError, match=r"^CLIENT_WELCOME"):
        parse(MsgType.CLIENT_WELCOME, header, 0)


def test_a_long_bad_value_is_shortened_in_the_error():
    with pytest.raises(ProtocolError) as e:
        parse(MsgType.HELLO, {"name": "x" * 10_000}, 0)
    assert len(str(e.value)) < 200
    assert str(e.value).endswith("...")


@pytest.mark.parametrize("msg_type, header", [
    (MsgType.CHUNK, piece()),
    (MsgType.RESULT, piece()),
    (MsgType.ASSIGN, {"samples": 60}),
    (MsgType.BCAST, {"key": "k", "origin": 1, "step": -1, "offset": 0, "total": 1,
                     "dtype": "float32"}),
])
def test_a_payload_type_without_a_payload_is_refused(msg_type, header):
    with pytest.raises(ProtocolError, match=f"^{msg_type.name} without a payload$"):
        parse(msg_type, header, 0)


def test_a_ring_segment_may_be_empty():
    """A ring of more workers than the vector has elements has empty segments; the ring
    checks each segment's size against the one it expects."""
    assert parse(MsgType.SEGMENT, segment(), 0).segment == segment()["segment"]


@pytest.mark.parametrize("msg_type, header", [
    (MsgType.HELLO, {}),
    (MsgType.FAIL, fail()),
    (MsgType.OPEN, {"step": 1}),
    (MsgType.JOINED, {"workers": 1}),
    (MsgType.SUBMIT, {"step": 1, "length": 4, "dtype": "float32"}),
    (MsgType.STATS, {}),
])
def test_a_control_type_with_a_payload_is_refused(msg_type, header):
    with pytest.raises(ProtocolError, match=f"^{msg_type.name} with a payload of 12 bytes$"):
        parse(msg_type, header, 12)


@pytest.mark.parametrize("fanout, stragglers, message", [
    ([3], [3], "layer 1: stragglers must be in 0..2 for fanout 3, got 3"),
    ([2, 2], [1], "fanout has 2 layers but stragglers has 1"),
])
def test_welcome_with_an_invalid_tree_is_refused(fanout, stragglers, message):
    with pytest.raises(ProtocolError,
                       match=re.escape(f"WELCOME: fields 'fanout'/'stragglers': {message}")):
        parse(MsgType.WELCOME, welcome(fanout=fanout, stragglers=stragglers), 0)


@pytest.mark.parametrize("name, layer", [
    ("3", 1),        # fanout 3: children 0..2
    ("0", 2),        # a layer-1 name at layer 2
    ("", 1),         # the master is not anyone's child
    ("0.0", 1),      # deeper than the one-layer tree
    ("00", 1),       # not the canonical spelling of child 0
])
def test_welcome_with_a_name_not_in_the_tree_at_that_layer_is_refused(name, layer):
    with pytest.raises(ProtocolError,
                       match=re.escape(f"WELCOME: field 'name' {name!r} is not a layer-{layer} node")):
        parse(MsgType.WELCOME, welcome(name=name, layer=layer), 0)


@pytest.mark.parametrize("fields", [{"total": 10}, {"dtype": "float32"}])
def test_welcome_with_half_of_the_trees_vector_is_refused(fields):
    with pytest.raises(ProtocolError,
                       match=r"^WELCOME: fields 'total' and 'dtype' come together$"):
        parse(MsgType.WELCOME, welcome(**fields), 0)


@pytest.mark.parametrize("fields", [{"total": 10}, {"dtype": "float32"},
                                    {"total": 0, "dtype": "float32"},
                                    {"total": 10, "dtype": "int8"}])
def test_joined_with_half_or_a_wrong_tree_vector_is_refused(fields):
    with pytest.raises(ProtocolError, match="JOINED"):
        parse(MsgType.JOINED, {"workers": 1, **fields}, 0)


def test_welcome_before_any_result_has_no_vector():
    msg = parse(MsgType.WELCOME, welcome(), 0)
    assert (msg.tree_step, msg.total, msg.dtype) == (-1, None, None)


def test_welcome_for_a_deep_node_names_its_tree():
    msg = parse(MsgType.WELCOME, welcome(name="2.1", layer=2, fanout=[3, 2], stragglers=[1, 0]), 0)
    assert msg.tree == Tree((3, 2), (1, 0))


# ---------------------------------------------------------------- ASSIGN's payload

def test_an_allocation_round_trips():
    p = plan(Tree.regular(2, 2, 1), 60)
    shares = {a.name: NodeShare(a.layer, tuple(a.local), tuple(a.responsibility))
              for a in p.nodes.values()}
    assert parse_allocation(pack_allocation(shares), 60) == shares


@pytest.mark.parametrize("payload, message", [
    (b"\xc1", "ASSIGN: undecodable allocation"),
    (msgpack.packb({"0": [1, [], []]}) + b"\x00", "ASSIGN: undecodable allocation"),  # trailing bytes
    (msgpack.packb({"0": [1, [], []]}, use_bin_type=True)[:-1], "ASSIGN: undecodable allocation"),
    (msgpack.packb([["0", 1, [], []]]), "ASSIGN: the allocation must be a map of node names"),
    (msgpack.packb({"0": 5}), "ASSIGN: allocation entry '0' must be [layer, local, responsibility]"),
    (msgpack.packb({"0": [1, []]}), "ASSIGN: allocation entry '0' must be [layer, local,"),
    (msgpack.packb({"0": ["1", [], []]}), "ASSIGN: allocation entry '0' must be [layer, local,"),
    (msgpack.packb({"0": [1, 5, []]}), "ASSIGN: ranges of '0' must be a list"),
    (msgpack.packb({"0": [1, [[0, 70, 1.0]], []]}),
     "ASSIGN: range [0, 70, 1.0] of '0' is not [start, stop, weight] within 0..60"),
    (msgpack.packb({"0": [1, [], [[-1, 5, 1.0]]]}), "ASSIGN: range [-1, 5, 1.0] of '0'"),
    (msgpack.packb({"0": [1, [[30, 20, 1.0]], []]}), "ASSIGN: range [30, 20, 1.0] of '0'"),
    (msgpack.packb({"0": [1, [[0, 10]], []]}), "ASSIGN: range [0, 10] of '0'"),
    (msgpack.packb({"0": [1, [[0, 10, "1"]], []]}), "ASSIGN: range [0, 10, '1'] of '0'"),
    (msgpack.packb({"0": [1, [[0.0, 10, 1.0]], []]}), "ASSIGN: range [0.0, 10, 1.0] of '0'"),
])
def test_a_malformed_allocation_is_a_protocol_error(payload, message):
    with pytest.raises(ProtocolError, match=r"^" + re.escape(message)):
        parse_allocation(payload, 60)


def test_an_allocation_may_cover_the_whole_batch_and_nothing():
    got = parse_allocation(msgpack.packb({"": [0, [], [[0, 60, 1]]], "0": [1, [[60, 60, 0.5]], []]}), 60)
    assert got == {"": NodeShare(0, (), ((0, 60, 1.0),)), "0": NodeShare(1, ((60, 60, 0.5),), ())}
    assert type(got[""].responsibility[0][2]) is float


# ---------------------------------------------------------------- ERROR -> exception

@pytest.mark.parametrize("kind, cls", [
    ("failed", StepFailed), ("lost", StepLost), ("refused", StepRefused),
    ("mismatch", MismatchError), ("busy", DaemonBusy), ("request", RequestRejected),
    ("shm", RequestRejected),
])
def test_a_client_error_becomes_its_exception(kind, cls):
    msg, _ = through_the_wire(ClientError("because", ErrorKind(kind), 5, 4, False))
    assert msg == ClientError("because", ErrorKind(kind), 5, 4, False)
    e = msg.exception()
    assert type(e) is cls
    assert "because" in str(e)
    if cls is StepFailed:
        assert (e.step, e.reason, e.tree_step, e.tree_wide) == (5, "because", 4, False)
    if cls in (StepLost, StepRefused):
        assert (e.step, e.tree_step) == (5, 4)


def test_a_client_error_without_a_step_keeps_the_tree_step():
    msg = parse(MsgType.ERROR, {"reason": "no shm", "kind": "shm", "step": None, "tree_step": 8,
                                "tree_wide": True}, 0)
    assert (msg.step, msg.tree_step) == (None, 8)
    assert type(msg.exception()) is RequestRejected



@pytest.mark.parametrize("header", [
    {"moves": [["0", "1", "no address", None]]},
    {"moves": [["0", "1", None]]},
    {"moves": "0"},
    {"moves": [["0", 1, None, None]]},
])
def test_a_move_with_a_bad_entry_is_refused(header):
    with pytest.raises(ProtocolError, match="MOVE"):
        parse(MsgType.MOVE, header, 0)


def test_a_refusal_that_sends_a_host_elsewhere_names_both_where_and_as_what():
    with pytest.raises(ProtocolError, match="come together"):
        parse(MsgType.REFUSE, {"reason": "moved", "retry": True, "to": "10.0.0.4:7070"}, 0)
    with pytest.raises(ProtocolError, match="REFUSE"):
        parse(MsgType.REFUSE, {"reason": "moved", "to": "nowhere", "name": "1"}, 0)
