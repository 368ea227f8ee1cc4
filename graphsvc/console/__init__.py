"""What the command line shows: the report of a replay (:mod:`~graphsvc.console.report`), node
listings (:mod:`~graphsvc.console.listing`, and :mod:`~graphsvc.console.tensor_listing` for arrays),
what order, validate, inspect, ops and gradcheck print (:mod:`~graphsvc.console.views`), convert's
output (:mod:`~graphsvc.console.convert`), drawings (:mod:`~graphsvc.console.render`), shell
completion (:mod:`~graphsvc.console.completion`), JSON, lines and tables
(:mod:`~graphsvc.console.printing`) and, on a terminal, tables and progress
(:mod:`~graphsvc.console.terminal`).

The library below never prints; ``cli.py`` calls into this room to turn results into text. The
modules import numpy, json and the replay engines inside the functions that need them, so a
command imports only what it uses.
"""
