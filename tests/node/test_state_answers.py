"""node/state_answers.py alone: which state answer the master takes, and when (no sockets,
no loop: the clock is an argument)."""

import numpy as np

from crnet.node.collectives.state_answers import ASKED, KEPT, Answer, StateAnswers, digest_of

KEY = "state/5"


def state(value: float, step: int = 3) -> tuple[bytes, Answer]:
    vector = np.full(4, value)
    h = digest_of(step, vector.dtype, vector.size)
    h.update(vector.tobytes())
    return h.digest(), Answer((KEY, "*"), "0", step, vector)


def asked(here=(), window: float = 10.0) -> StateAnswers:
    answers = StateAnswers(lambda: list(here), window)
    answers.opened(KEY)
    return answers


def test_the_digest_covers_the_step_the_shape_and_every_byte():
    assert state(1.0)[0] == state(1.0)[0]
    assert len({state(1.0)[0], state(1.0, step=4)[0], state(2.0)[0]}) == 3
    h = digest_of(3, np.dtype(np.float64), 4)
    for piece in np.split(np.full(4, 1.0).view(np.uint8), 4):   # piece by piece, the same
        h.update(piece.tobytes())
    assert h.digest() == state(1.0)[0]


def test_two_slots_that_agree_decide_and_one_does_not():
    answers = asked()
    answers.copy(KEY, 2, *state(666.0), now=0.0)
    assert answers.decision(1.0, [0, 1, 2]) is None
    answers.copy(KEY, 0, *state(1.0), now=1.0)
    assert answers.decision(1.0, [0, 1, 2]) is None
    d, _ = state(1.0)
    answers.copy(KEY, 1, d, None, now=2.0)       # voted by digest: slot 0 kept the bytes
    got = answers.decision(2.0, [0, 1, 2])
    assert got is not None and got.vector[0] == 1.0


def test_a_slot_votes_once():
    answers = asked()
    answers.copy(KEY, 0, *state(1.0), now=0.0)
    assert not answers.counts(KEY, 0) and answers.counts(KEY, 1)
    answers.copy(KEY, 0, *state(1.0), now=0.0)
    assert answers.decision(0.0, [0, 1]) is None


def test_the_only_slot_with_processes_attached_needs_no_second():
    answers = asked()
    answers.copy(KEY, 1, *state(1.0), now=0.0)
    assert answers.decision(0.0, [0, 1]) is None
    assert answers.decision(0.0, [1]).vector[0] == 1.0
    assert asked().decision(0.0, [1]) is None        # no copy yet


def test_the_window_takes_a_lone_state_and_never_one_that_is_contradicted():
    answers = asked(window=10.0)
    answers.copy(KEY, 0, *state(1.0), now=5.0)
    assert answers.decision(14.9, [0, 1, 2]) is None
    assert answers.next_check(14.9) == 15.0
    assert answers.decision(15.0, [0, 1, 2]).vector[0] == 1.0
    answers = asked(window=10.0)
    answers.copy(KEY, 2, *state(666.0), now=0.0)
    answers.copy(KEY, 0, *state(1.0), now=1.0)
    assert answers.decision(60.0, [0, 1, 2]) is None and answers.next_check(60.0) is None


def test_nothing_is_decided_while_a_process_here_can_answer():
    b, a = object(), object()
    here = [a, b]
    answers = asked(here=here)
    answers.asked(a)
    for k in (0, 1):
        answers.copy(KEY, k, *state(1.0), now=0.0)
    assert answers.decision(99.0, [0, 1]) is None
    here.remove(b)
    answers.left(b)
    assert answers.decision(99.0, [0, 1]).vector[0] == 1.0


def test_at_most_kept_states_are_kept_and_only_for_requests_sent_down():
    answers = asked()
    assert answers.keeps(KEY, 0) and answers.keeps(KEY, KEPT - 1) and not answers.keeps(KEY, KEPT)
    for k in range(KEPT):
        answers.copy(KEY, k, *state(float(k)), now=0.0)
    assert not answers.keeps(KEY, 0)
    answers.copy(KEY, KEPT, *state(float(KEPT)), now=0.0)   # given bytes anyway: not kept
    assert answers.decision(0.0, None) is None
    d, _ = state(float(KEPT))
    answers.copy(KEY, KEPT + 1, d, None, now=0.0)
    assert answers.decision(0.0, None) is None        # agreed, but its bytes are not here
    assert not answers.counts("state/4", 0) and not answers.keeps("state/4", 0)
    for nonce in range(ASKED):
        answers.opened(f"state/{100 + nonce}")
    assert not answers.counts(KEY, 9)                  # only the newest requests count


def test_an_answer_given_makes_the_copies_moot():
    answers = asked()
    answers.copy(KEY, 0, *state(1.0), now=0.0)
    answers.answered()
    assert not answers.counts(KEY, 1) and answers.decision(99.0, [0]) is None


def test_a_split_request_is_asked_once_more_once_and_the_masters_own_never():
    answers = asked()
    answers.copy(KEY, 0, *state(1.0), now=0.0)
    answers.copy(KEY, 1, *state(2.0), now=0.0)
    assert not answers.split()                          # not before decision() saw it
    assert answers.decision(0.0, [0, 1]) is None
    assert answers.split() and not answers.split()
    answers.opened("state/6", again=True)
    answers.copy("state/6", 0, *state(1.0), now=1.0)
    answers.copy("state/6", 1, *state(3.0), now=1.0)
    assert answers.decision(1.0, [0, 1]) is None and not answers.split()
