"""crnetd's log lines (crnet/node/observe/logs.py): one event per line, key=value or JSON, read back."""

import io
import json
import logging

import pytest

from crnet.node.observe import logs


@pytest.fixture
def logger():
    """A logger writing through crnetd's formatter into a buffer: (logger, buffer, set_format)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("crnet.test_logs")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)

    def fmt(kind, timestamps=True):
        handler.setFormatter(logs.EventFormatter(kind, timestamps))
    fmt("kv")
    yield log, out, fmt
    log.removeHandler(handler)


NASTY = 'child "0.1" said: stalled\n2001-01-01 ERROR forged line\tand=more \\ \u2028 end'


@pytest.mark.parametrize("kind", ["kv", "json"])
def test_a_line_reads_back_to_its_fields(logger, kind):
    log, out, fmt = logger
    fmt(kind)
    log.handlers[0].addFilter(logs.NodeTag(lambda: "0.2"))
    log.warning("step %d: %s", 7, NASTY, extra={"step": 7})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines                 # the newline stayed inside the value
    fields = logs.parse_kv(lines[0]) if kind == "kv" else json.loads(lines[0])
    assert list(fields) == ["ts", "level", "logger", "node", "step", "msg"]
    assert fields["level"] == "warning" and fields["logger"] == "crnet.test_logs"
    assert fields["node"] == "0.2" and str(fields["step"]) == "7"
    assert fields["msg"] == f"step 7: {NASTY}"


def test_kv_leaves_simple_values_bare_and_quotes_the_rest():
    assert logs.format_kv({"level": "info", "node": "master", "step": 3, "msg": "a b",
                           "x": "", "y": "k=v"}) == \
        'level=info node=master step=3 msg="a b" x="" y="k=v"'


def test_no_timestamp_under_systemd_and_no_node_before_a_slot(logger, monkeypatch):
    log, out, _ = logger
    monkeypatch.setenv("INVOCATION_ID", "abc")
    assert logs.under_systemd()
    handler = log.handlers[0]
    handler.addFilter(logs.NodeTag(lambda: None))     # a daemon without a slot yet
    handler.setFormatter(logs.EventFormatter("kv", timestamps=not logs.under_systemd()))
    log.info("joining")
    assert out.getvalue() == "level=info logger=crnet.test_logs msg=joining\n"


def test_a_traceback_is_one_line(logger):
    log, out, _ = logger
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("internal error")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    fields = logs.parse_kv(lines[0])
    assert fields["msg"] == "internal error"
    assert fields["exc"].startswith("Traceback") and "ValueError: bad\nthing" in fields["exc"]


def test_set_log_level_announces_the_change_where_it_is_seen(logger):
    root = logging.getLogger()
    was = root.level
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.EventFormatter("kv", timestamps=False))
    root.addHandler(handler)
    try:
        root.setLevel(logging.WARNING)
        logs.set_log_level("debug", announce="now debug")
        assert root.level == logging.DEBUG
        logs.set_log_level("error", announce="now error")
        assert root.level == logging.ERROR
        assert out.getvalue().splitlines() == [
            "level=info logger=crnet.node.observe.logs msg=\"now debug\"",
            "level=info logger=crnet.node.observe.logs msg=\"now error\""]
    finally:
        root.removeHandler(handler)
        root.setLevel(was)


def test_name_node_tags_the_root_handlers_until_undone():
    root = logging.getLogger()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.EventFormatter("kv", timestamps=False))
    root.addHandler(handler)
    log = logging.getLogger("crnet.test_name_node")
    slot: list[str | None] = [None]
    try:
        undo = logs.name_node(lambda: slot[0])
        log.warning("joining")
        slot[0] = "0.2"
        log.warning("joined")
        undo()
        log.warning("stopped")
    finally:
        root.removeHandler(handler)
    assert out.getvalue().splitlines() == [
        "level=warning logger=crnet.test_name_node msg=joining",
        "level=warning logger=crnet.test_name_node node=0.2 msg=joined",
        "level=warning logger=crnet.test_name_node msg=stopped"]
