"""Ring allreduce (``--scheme rar``): reduce-scatter, then all-gather, around the hosts."""
