"""The math, free of I/O: gradient codes, trees and allocations, the decode beyond s, and the
coded-sum kernels (``_core.pyx``, nogil; ``kernels.py`` is their public face)."""
