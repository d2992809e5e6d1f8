"""CodedReduce at one node (schemes cr, gc and tree): ``driver.py`` decodes each chunk from
the fastest children, ``step.py`` one step as pure state, ``beyond.py`` the decode beyond s."""
