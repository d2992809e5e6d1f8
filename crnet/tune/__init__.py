"""The run-time model and ``crnet tune``: predicted step times (``model.py``), the fit of
measured times to its inputs (``fit.py``), a running tree's measurements ranked
(``tuning.py``) and a probe of an idle tree (``probe.py``)."""
