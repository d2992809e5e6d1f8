"""spread: CodedReduce with each chunk decoded at its owner (docs/spread.md): ``driver.py``
at one host, ``step.py`` one step, ``owners.py`` who owns which chunks."""
