"""Peer links beside the tree (rar's successor, spread's every other host): the mesh, the
ranks a link claims confirmed, and --tls-names."""
