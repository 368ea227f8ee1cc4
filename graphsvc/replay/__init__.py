"""Replaying a graph: forward recomputes values from the leaves, backward gives every gradient.

:mod:`graphsvc.replay.run` is the entry point (:func:`~graphsvc.replay.run.forward`,
:func:`~graphsvc.replay.run.backward`, the CLI's replays); behind it, :mod:`graphsvc.replay.columns`
replays graphs of float64 scalars a column at a time and :mod:`graphsvc.replay.arrays` replays
graphs of arrays one op call per node; either way the result is one
:class:`~graphsvc.replay.run.ReplayRun`, its steps :class:`~graphsvc.replay.step.Step`.
:mod:`graphsvc.replay.compare` holds replayed numbers against stored ones (one ``Comparison``) and
finds where nan or inf first appears (one ``NonFinite``); :mod:`graphsvc.replay.memory` keeps
freed blocks for the next pass of a tensor replay. :mod:`graphsvc.replay.gradcheck` checks a graph's
gradient against finite differences of its replays.
"""
