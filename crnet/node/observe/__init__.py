"""What a node tells of itself: ``crnet status`` (its subtree), the measured section and
probe (``crnet tune``), Prometheus metrics, systemd notify, and its log lines."""
