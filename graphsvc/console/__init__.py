"""What the command line shows: node listings (:mod:`~graphsvc.console.listing`, and
:mod:`~graphsvc.console.tensor_listing` for arrays), tables and progress on a terminal
(:mod:`~graphsvc.console.terminal`) and drawings (:mod:`~graphsvc.console.render`).

The library below never prints; ``cli.py`` calls into this room to turn results into text.
"""
