"""Replaying a graph: forward recomputes values from the leaves, backward gives every gradient.

:mod:`graphsvc.replay.run` is the entry point (:func:`~graphsvc.replay.run.forward`,
:func:`~graphsvc.replay.run.backward`, the CLI's replays); behind it, :mod:`graphsvc.replay.columns`
replays graphs of float64 scalars a column at a time and :mod:`graphsvc.replay.arrays` replays
graphs of arrays one op call per node. :mod:`graphsvc.replay.compare` holds replayed numbers
against stored ones and finds where nan or inf first appears; :mod:`graphsvc.replay.memory` keeps
freed blocks for the next pass of a tensor replay.
"""
