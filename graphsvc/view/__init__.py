"""``graphsvc view``: a graph of any size in a web browser.

- ``model.py``: what the page is given, a view at a time (``ViewModel``: nodes grouped by the
  dotted structure of their names; the page never receives the whole graph);
- ``server.py``: serves it on 127.0.0.1, with the page in ``static/``.

The ``view`` command in cli.py runs both. Nothing else in graphsvc imports this room.
"""
