"""``graphsvc view``: a graph of any size in a web browser.

:mod:`graphsvc.view.model` groups the nodes and answers the page's questions a view at a time (the
page never receives the whole graph); :mod:`graphsvc.view.server` serves it on 127.0.0.1 with the
page in ``static/``; the ``view`` command in cli.py runs both. Nothing else in graphsvc imports
this room.
"""
