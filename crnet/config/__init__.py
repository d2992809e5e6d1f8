"""crnetd's options, each declared once (``options.py``), their value types, the tree a
command describes, and the effective configuration (flag > CRNET_* > file > default)."""
