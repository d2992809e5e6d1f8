"""Where hosts go when the master re-plans to another shape (``crnet/node/join/moves.py``):
pure, from names and addresses."""

from __future__ import annotations

import pytest

from crnet.coding.plan import Tree
from crnet.node.join.moves import move_table, placement

OLD = Tree((2, 2), (1, 1))          # workers 0, 1, 0.0, 0.1, 1.0, 1.1
STAR = Tree((6,), (1,))


def test_a_tree_moves_to_a_star_in_rank_order_when_every_host_listens():
    where = placement(OLD, STAR, set(OLD.names()) - {""}, peers=True)
    assert where == {"0": "0", "1": "1", "0.0": "2", "0.1": "3", "1.0": "4", "1.1": "5"}


def test_a_star_moves_to_a_tree_whose_parents_are_the_hosts_that_listen():
    # Only hosts 4 and 5 listen: they take the new tree's two parents' places.
    where = placement(STAR, OLD, {"4", "5"}, peers=False)
    assert where is not None
    assert (where["4"], where["5"]) == ("0", "1")
    assert sorted(where.values()) == sorted(n for n in OLD.names() if n)
    assert [where[o] for o in ("0", "1", "2", "3")] == ["0.0", "0.1", "1.0", "1.1"]


def test_too_few_listening_hosts_cannot_move():
    assert placement(STAR, OLD, {"4"}, peers=False) is None          # two parents to place
    assert placement(OLD, STAR, {"0", "1"}, peers=True) is None       # spread: all must listen
    assert placement(OLD, STAR, {"0", "1"}, peers=False) == {          # a star's leaves need not
        "0": "0", "1": "1", "0.0": "2", "0.1": "3", "1.0": "4", "1.1": "5"}


def test_trees_of_different_sizes_do_not_move():
    with pytest.raises(ValueError, match="6 workers cannot move to one of 4"):
        placement(OLD, Tree((4,), (0,)), set(OLD.names()), peers=False)


def test_the_table_names_each_hosts_new_parent_by_where_that_host_listens():
    where = placement(STAR, OLD, {"4", "5"}, peers=False)
    assert where is not None
    star_addresses = {str(i): f"10.1.0.{i}:7070" for i in range(6)}
    table = {e[0]: e[1:] for e in move_table(where, OLD, star_addresses)}
    assert table["4"] == ("0", None, "10.1.0.4:7070")                 # under the master
    assert table["0"] == ("0.0", "10.1.0.4:7070", "10.1.0.0:7070")    # under host 4
    assert table["3"] == ("1.1", "10.1.0.5:7070", "10.1.0.3:7070")    # under host 5
