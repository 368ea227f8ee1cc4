"""One step of a backward pass, as ``--steps`` shows it, whichever engine replayed.

:func:`graphsvc.replay.columns.backward_steps` (float64 scalars) and
:func:`graphsvc.replay.arrays.backward` (arrays) both record :class:`Step` (the first as
:class:`SweptSteps`, made from the sweep's columns when read).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, overload

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Step", "SweptSteps"]


class Step(NamedTuple):
    """One node of the backward pass: its gradient, and for each parent ``(parent, local, sent)``.

    ``sent`` is what the node adds to the parent's gradient: ``grad * local`` for a scalar (a
    float), the cotangent of the op's VJP for an array (``None`` for an input that gets no
    gradient). ``local`` is the local derivative d(node)/d(parent) where the engine has one (the
    column engine's scalars), else ``None`` (a VJP maps gradients without one). A leaf's step has
    no contributions: it is where the gradient ends. (A NamedTuple: a million steps are cheap.)
    """

    node: int
    grad: Any
    contributions: list[tuple[int, Any, Any]]


class SweptSteps(Sequence[Step]):
    """The steps of a backward sweep over float64 columns (:func:`graphsvc.replay.columns.backward_steps`),
    each made when it is read, from what the sweep keeps anyway: the gradients, the local derivative
    of each edge and the parents (CSR). A node's gradient is final when the sweep reaches it (ids
    are a topological order: its children come first), so ``Step(node, grads[node], [(parent,
    local, grads[node] * local), ...])`` is the step the sweep took, to the bit. A million steps then
    cost 8 bytes each until read, not a tuple, a list and floats each; ``--steps`` reads them a
    chunk at a time (slices)."""

    def __init__(
        self,
        nodes: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float64],
        local: npt.NDArray[np.float64],
        offsets: npt.NDArray[np.integer[Any]],
        parents: npt.NDArray[np.integer[Any]],
    ) -> None:
        #: The nodes in the sweep's order (decreasing ids).
        self.nodes = nodes
        self._grads, self._local, self._offsets, self._parents = grads, local, offsets, parents

    def __len__(self) -> int:
        return len(self.nodes)

    @overload
    def __getitem__(self, index: int) -> Step: ...

    @overload
    def __getitem__(self, index: slice) -> list[Step]: ...

    def __getitem__(self, index: int | slice) -> Step | list[Step]:
        if isinstance(index, slice):
            start, stop, stride = index.indices(len(self))
            if stride != 1:
                return [self[i] for i in range(start, stop, stride)]
            return self._made(start, stop)
        position = range(len(self))[index]  # an IndexError as a list gives it
        return self._made(position, position + 1)[0]

    def __iter__(self) -> Iterator[Step]:
        for start in range(0, len(self), _CHUNK):
            yield from self._made(start, min(start + _CHUNK, len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<SweptSteps of {len(self)} steps>"

    def _made(self, start: int, stop: int) -> list[Step]:
        """The steps from ``start`` to ``stop`` (positions in the sweep), made in one pass: their
        nodes' edges are one run of the CSR columns (the nodes' ids decrease)."""
        nodes = self.nodes[start:stop].tolist()
        if not nodes:
            return []
        low, high = nodes[-1], nodes[0]
        offsets = self._offsets[low : high + 2].tolist()
        first = offsets[0]
        parents = self._parents[first : offsets[-1]].tolist()
        local = self._local[first : offsets[-1]].tolist()
        grads = self._grads[nodes].tolist()
        steps = []
        for node, grad in zip(nodes, grads, strict=True):
            span = range(offsets[node - low] - first, offsets[node - low + 1] - first)
            steps.append(Step(node, grad, [(parents[s], local[s], grad * local[s]) for s in span]))
        return steps


#: How many steps :class:`SweptSteps` makes at a time when iterated.
_CHUNK = 4096
