"""graphsvc view: a graph of any size in a web browser. model.py is what the page is given (ViewModel),
server.py serves it on 127.0.0.1 with the page in static/ (the `view` command in cli.py runs both)."""
