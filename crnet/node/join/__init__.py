"""Joining: a node's place in the tree, its child slots, its share, WELCOME, and the tree's
moves and re-plans between jobs; ``dial.py`` keeps a dialed link up."""
