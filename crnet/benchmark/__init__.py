"""``crnet bench``: every scheme and PyTorch's Gloo on an emulated cluster, side by side."""
