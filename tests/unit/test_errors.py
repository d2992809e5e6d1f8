"""crnet's one error tree, and how a daemon's ERROR kind becomes the exception a process raises."""

import inspect

import pytest

import crnet
from crnet import errors
from crnet.errors import (
    AssignmentChanged,
    CrnetError,
    CrnetTimeout,
    DaemonBusy,
    DaemonNotRunning,
    ErrorKind,
    JobEnded,
    JoinRefused,
    MismatchError,
    RequestRejected,
    StepFailed,
    StepLost,
    StepRefused,
)

ERROR_CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, BaseException) and cls.__module__ == errors.__name__]


def test_the_module_defines_the_documented_errors():
    assert {cls.__name__ for cls in ERROR_CLASSES} == {
        "CrnetError", "ProtocolError", "NotThatHost", "JoinRefused", "DaemonNotRunning", "DaemonBusy",
        "RequestRejected", "StepFailed", "StepLost", "StepRefused", "StaleReplica", "AssignmentChanged",
        "MismatchError", "CrnetTimeout", "LaunchError", "JobEnded", "InternalError"}


def test_the_module_docstring_draws_every_error():
    for cls in ERROR_CLASSES:
        assert cls.__name__ in errors.__doc__


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_is_a_crnet_error(cls):
    assert issubclass(cls, CrnetError)


@pytest.mark.parametrize("cls, builtin", [
    (DaemonNotRunning, ConnectionError),
    (MismatchError, ValueError),
    (CrnetTimeout, TimeoutError),
])
def test_errors_that_are_also_builtin_errors(cls, builtin):
    # Callers that catch the builtin (a retry loop on ConnectionError, say) catch these too.
    assert issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("x")


def test_step_failed_carries_its_step_reason_and_where_the_tree_is():
    e = StepFailed(12, "master did not get 2 of 3 children", tree_step=11)
    assert (e.step, e.reason, e.tree_step, e.tree_wide) == (
        12, "master did not get 2 of 3 children", 11, True)
    assert str(e) == "step 12 failed: master did not get 2 of 3 children"
    local = StepFailed(13, "node 0 got no decision", 11, tree_wide=False)
    assert local.tree_wide is False
    assert (StepFailed(1, "r").tree_step, StepFailed(1, "r").tree_wide) == (-1, True)


@pytest.mark.parametrize("cls", [StepLost, StepRefused])
def test_lost_and_refused_steps_say_where_the_tree_is(cls):
    e = cls("the tree is at step 40", step=20, tree_step=40)
    assert (str(e), e.step, e.tree_step) == ("the tree is at step 40", 20, 40)
    assert (cls("r").step, cls("r").tree_step) == (None, -1)


def test_assignment_changed_carries_the_new_assignment():
    new = {"name": "0", "layer": 1, "samples": 24, "workers": 6, "ranges": ((0, 6, 1.0),)}
    e = AssignmentChanged("the tree re-assigned this host", new)
    assert (str(e), e.assignment) == ("the tree re-assigned this host", new)


def test_join_refused_says_whether_to_retry():
    assert JoinRefused("slot 0 is held").retry is False
    e = JoinRefused("the parent has not joined yet", retry=True)
    assert (e.reason, e.retry, str(e)) == ("the parent has not joined yet", True,
                                           "the parent has not joined yet")


@pytest.mark.parametrize("kind, cls", [
    (ErrorKind.FAILED, StepFailed),
    (ErrorKind.LOST, StepLost),
    (ErrorKind.REFUSED, StepRefused),
    (ErrorKind.JOB, JobEnded),
    (ErrorKind.MISMATCH, MismatchError),
    (ErrorKind.BUSY, DaemonBusy),
    (ErrorKind.REQUEST, RequestRejected),
    (ErrorKind.SHM, RequestRejected),
])
def test_error_kind_maps_to_its_exception(kind, cls):
    e = kind.exception("why", step=4)
    assert type(e) is cls
    assert "why" in str(e)


def test_every_error_kind_is_mapped():
    assert {k.value for k in ErrorKind} == {"failed", "lost", "refused", "job", "mismatch",
                                            "busy", "request", "shm"}
    for kind in ErrorKind:
        assert isinstance(kind.exception("r"), CrnetError)


def test_a_failed_kind_keeps_the_step_or_marks_it_unknown():
    assert ErrorKind.FAILED.exception("gone", step=7).step == 7
    assert ErrorKind.FAILED.exception("gone").step == -1


def test_the_step_kinds_keep_where_the_tree_is():
    failed = ErrorKind.FAILED.exception("cut off", 7, 6, False)
    assert (failed.step, failed.tree_step, failed.tree_wide) == (7, 6, False)
    for kind in (ErrorKind.LOST, ErrorKind.REFUSED):
        e = kind.exception("far", 30, 6)
        assert (e.step, e.tree_step) == (30, 6)


def test_the_wire_value_of_a_kind_is_its_string():
    assert ErrorKind("busy") is ErrorKind.BUSY
    with pytest.raises(ValueError):
        ErrorKind("nope")


@pytest.mark.parametrize("name", [
    "CrnetError", "CrnetTimeout", "DaemonBusy", "DaemonNotRunning", "MismatchError",
    "ProtocolError", "RequestRejected", "StepFailed", "StepLost", "StepRefused",
    "AssignmentChanged", "JobEnded"])
def test_the_package_exports_the_errors_a_training_process_sees(name):
    assert name in crnet.__all__
    assert getattr(crnet, name) is getattr(errors, name)
