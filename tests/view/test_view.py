"""graphsvc.view: the room's docstring is its map, naming each of its modules."""

from __future__ import annotations

from pathlib import Path

import graphsvc.view


def test_the_room_docstring_names_each_module() -> None:
    room = Path(graphsvc.view.__file__).parent
    modules = sorted(path.name for path in room.glob("*.py") if path.name != "__init__.py")
    assert modules == ["model.py", "server.py"]
    assert all(name in (graphsvc.view.__doc__ or "") for name in modules)
