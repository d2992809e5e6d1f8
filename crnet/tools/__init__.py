"""What runs whole trees on one machine: the launcher (``launch.py``), ``crnet run``,
``crnet demo``, process stopping, and the ``crnet status`` client."""
