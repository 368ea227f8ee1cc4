"""The exception hierarchy: every error comes back from pickle (a process pool, copy) as it was."""

from __future__ import annotations

import pickle

import pytest

from graphsvc import errors
from graphsvc.errors import GraphsvcError, MissingOpsError, TooLargeToDraw

#: An instance of each class whose constructor takes more than a message.
MADE_OF_MORE = {
    MissingOpsError: MissingOpsError(
        "the graph uses an op not registered here: tanhh (plugin unknown; did you mean 'tanh'?)", install_hint=False
    ),
    TooLargeToDraw: TooLargeToDraw("the graph has 5,001 nodes, more than one picture can show (5000)", None),
}

CLASSES = [value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, GraphsvcError)]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_comes_back_from_pickle_with_its_message_and_attributes(cls: type[GraphsvcError]) -> None:
    """Each class of errors.py, a new one included: one whose constructor takes more than a message
    fails here until it is given an example above (and survives pickle)."""
    error = MADE_OF_MORE.get(cls) or cls("the message")
    error.add_note("a note added where it was raised")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), copy.args, vars(copy)) == (str(error), error.args, vars(error))


def test_a_missing_ops_error_without_the_install_hint_keeps_it_off() -> None:
    message = "the graph uses an op not registered here: relu (plugin graphsvc-x)"
    copy = pickle.loads(pickle.dumps(MissingOpsError(message, install_hint=False)))
    assert (copy.install_hint, str(copy)) == (False, message)


def test_too_large_to_draw_around_a_node_comes_back_with_its_problem_node_and_remedy() -> None:
    error = TooLargeToDraw("the neighbourhood of x within 2 edges holds more than 5,000 nodes", "x")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.problem, copy.around) == (error.problem, "x")
    assert str(copy) == "the neighbourhood of x within 2 edges holds more than 5,000 nodes; give a smaller depth"


def test_the_exit_code_table_lists_each_code_once_and_every_error_class_code() -> None:
    import re

    from graphsvc import errors
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = text[text.index("| code | meaning |") :].split("\n\n")[0]
    codes = [int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)]
    assert codes == sorted(set(codes)) == [0, 1, 2, 3, 4, 5, 130, 143]
    raised = {
        cls.exit_code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.GraphsvcError) and cls is not errors.GraphsvcError
    }
    assert raised <= set(codes)
