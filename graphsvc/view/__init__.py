"""``graphsvc view``: a graph of any size in a browser.

:mod:`graphsvc.view.model` groups the nodes and answers the page's questions a view at a time; the
page never receives the whole graph. Nothing else in graphsvc imports this room.
"""
