"""Aggregation schedules: what a node does with chunks, free of sockets.

A schedule decides where each incoming chunk goes and when a chunk is ready to
leave; the daemon moves the bytes.
"""
