"""The run-time model and ``crnet tune``: predicted step times (``model.py``), the fit of
measured times to its inputs (``fit.py``), a running tree's measurements ranked
(``tuning.py``) and a probe of an idle tree (``probe.py``), pure all of them; what asks a
tree for those over the network (``gather.py``: ``crnet status``'s client)."""
