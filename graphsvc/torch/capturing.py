"""capture(): one step of a PyTorch model, every ATen call with its values and PyTorch's own
gradients, as a graphsvc :class:`~graphsvc.graph.Graph`.

How it records, and why:

- **At the level of ATen operators**, through a ``TorchDispatchMode``: it sees every operator the
  forward runs, with its real arguments, below autograd, after Python-level decompositions (so a
  ``nn.Linear`` is ``t`` and ``addmm``, whatever Python code called it). The backward runs with the
  mode off (it records nothing, and a Python call for each of its ATen calls cost a third of a
  transformer layer's step); calls made by a backward inside another mode
  (``torch._C._current_autograd_node()`` is set) and by the capture's own hooks are not recorded.
- **The mode's handler is marked for Dynamo to skip** (with everything it calls: what
  ``torch._dynamo.disable(recursive=True)`` does) in PyTorch's C part, not wrapped in
  ``torch._dynamo.disable`` as a ``TorchDispatchMode``'s handler is by default: that wrapper is two
  more Python calls for every ATen call and imports ``torch._dynamo`` (a second or more) at the
  first. A function made by ``torch.compile`` in the block runs eagerly under the mode (Dynamo does not
  compile while a dispatch mode is active; with ``fullgraph=True`` PyTorch raises that it compiled
  nothing), and Dynamo never sees the recording itself. A PyTorch without that mark gets the
  default wrapper.
- **Gradients come from PyTorch**, not from a replay: a hook (``Tensor.register_hook``) on each
  floating-point tensor a recorded op produced, registered when the next operator is dispatched (the
  output has its ``grad_fn`` by then; an in-place op's input gets its hook before the op runs, so it
  receives the gradient of the value before the change), and on each parameter and input that
  requires grad (a leaf's hook fires once with its total gradient: ``p.grad`` after a backward from
  zeroed grads).
- **Tensors are known by identity and version**: a map from tensor (by identity) to (node, ``_version``). An
  in-place op (``relu_``, ``add_``, ``sigmoid_``) records the functional op as a new node and rebinds
  the tensor to it. A tensor read after its memory was changed in place through another view (its
  version moved without the capture rebinding it) is refused, as is an in-place op on a view of a
  tensor when the result depends on anything but constants (``h[:, 0].mul_(2)``): a graph of
  functional ops cannot hold it.
- **Values are not copied while the step runs**: a node keeps the tensor it was given, and a tensor
  about to be changed in place (an in-place op's argument, batch norm's running statistics) is copied
  first together with every recorded tensor on the same memory (views and ``unsafe_split`` chunks
  share it). The graph is built when the ``with`` block ends: each value and gradient is copied
  into it, except a C-ordered tensor the step's ops made that no one else holds (the Python object
  or its memory: ``torch._C._storage_Use_Count``), whose memory the graph keeps as it is (a step's
  values and gradients are as large as its activations: copying them all costs about as much as
  the step). Parameters, inputs, ``p.grad`` and whatever the step's code still holds are copied,
  so an optimizer's step or ``zero_grad`` after the block changes nothing in the graph. The copies
  are made in memory an earlier graph gave back (:func:`graphsvc.replay.memory.reuse`, as a
  replay's arrays), not in fresh pages, a page fault each: a capture a step, in a loop, touches the
  same pages.
- **Constants are folded**: a factory or random op (``empty_like``, ``ones_like``, ``bernoulli_``,
  ``zeros``, ...) and any op whose inputs are all constants become a ``const`` node holding the
  recorded value, so a replay reproduces the step exactly (dropout's mask).
- **The output** is the tensor the step's backward was called on (``torch.autograd.backward`` is
  wrapped while the capture runs). A non-scalar output, or one seeded with anything but 1, gets a
  ``sum(mul(out, seed))`` node as the graph's output, so a replay seeded with 1 reproduces it. Only
  the nodes the output depends on are kept. A step without backward keeps every node and no
  gradients. After the backward, nothing more is recorded (an optimizer's step is not part of it).
- **Custom ``torch.autograd.Function``\\ s** (``Function.apply`` is wrapped while the capture runs)
  are one node each, tagged by the Function's qualified name (``module.Class``), with PyTorch's values
  and gradients; the ops inside are not recorded. Replaying it needs a plugin that registers that
  name.
- **Op tags**: ops graphsvc has map to them (:data:`_MAPPED`; the fused ops ``addmm``,
  ``layer_norm``, ``batch_norm``, ``scaled_dot_product_attention``, ``stack`` and ``slice`` when the
  op registry has them, else a few are written with graphsvc's elementwise and shape ops); every
  other op keeps PyTorch's name (``aten.mkldnn_rnn_layer.default``) with its arguments as
  attributes (:mod:`graphsvc.torch.calls`), which the ``graphsvc-torch`` plugin replays.
- **Names**: parameters and buffers by ``named_parameters()`` and ``named_buffers()``, other inputs
  ``input0``, ``input1``, ... in the order the step first uses them, and every other node
  ``<module path>.<op>`` (``layers.0.linear1.addmm``; a repeat gets a number: ``self_attn.bmm1``).
  A parameter or input that requires grad is a ``leaf``; one that does not (the batch, labels,
  buffers, a frozen parameter) is a ``const`` in the graph, so a replay, like PyTorch, computes no
  gradient for it (ops on such tensors alone stay ops, so a step of plain tensors keeps its ops).
  What an op makes under ``torch.no_grad()`` is a ``const`` holding its value in a step with a
  backward (a constant to PyTorch's backward: the ops before it that nothing else needs go), a
  clone, alias or view to its own shape of a tensor that requires grad included (it gets a node of
  its own, an identity ``reshape``, where it would otherwise be the tensor's node). An in-place op
  under ``torch.no_grad()`` on a leaf that requires grad (a weight normalized by hand, a lazy
  module's initialization) makes a new leaf with the new value, the leaf's name and its gradient
  (the value before is the const ``<name>.before``, kept if the step used it: PyTorch's gradient
  then sums both uses, and ``--check`` reports the leaf's); on any other tensor it is recorded as
  any other op. A custom Function applied under ``torch.no_grad()`` is a ``const`` as an op is.
  Module paths come from global forward hooks on ``nn.Module`` (cheaper than
  ``torch.utils.module_tracker.ModuleTracker``, which also hooks every backward).
- While the block runs, ``torch.autograd.backward``, ``Function.apply`` and two global ``nn.Module``
  forward hooks are the capture's (all restored when it ends, an exception or not, and when starting
  it fails half way); the dispatch mode is the calling thread's, and a backward, a
  ``Function.apply`` or a module call another thread runs meanwhile is not the step's. Capture one
  step at a time.
- int64 and bool tensors are kept as int64 (a graph file holds float64, float32 and int64); other
  dtypes (float16, complex) are refused naming the op. CUDA tensors are copied to the host when the
  graph is built.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphsvc.errors import UsageError
from graphsvc.graph import CONST, LEAF, Graph, graph_from_lists, sealed
from graphsvc.native import compiled_checks
from graphsvc.replay import memory
from graphsvc.torch.calls import UnencodableArgument, encode_call

__all__ = ["Capture", "CaptureError", "capture"]


class CaptureError(UsageError):
    """A step that a graph cannot hold (named by the op), or a capture used out of order."""


#: ATen ops whose result does not depend on their tensor arguments' values, and through which
#: PyTorch's backward sends no gradient (factories, random draws): their result is a const. Named as
#: a plan names an op: an in-place op (``uniform_``) is recorded as its functional form (``uniform``).
#: Not ``fill`` (``fill.Tensor`` passes its value's gradient) nor ``normal`` (its tensor overloads).
_FACTORIES = frozenset(
    "empty_like zeros_like ones_like full_like rand_like randn_like randint_like bernoulli uniform exponential "
    "random zero empty zeros ones full arange rand randn randint randperm scalar_tensor empty_strided "
    "new_empty new_zeros new_ones new_full new_empty_strided linspace eye".split()
)
#: Ops that change an argument in place without saying so in their schema: (op name, positions).
_HIDDEN_WRITES = {"native_batch_norm": (3, 4), "_native_batch_norm_legit": (3, 4)}
_REDUCTIONS = ("none", "mean", "sum")


def capture(model: Any = None) -> Capture:
    """Record one step (forward and backward) of ``model`` (an ``nn.Module``, or None to record any
    tensors): ``with capture(model) as run: ...; graph = run.graph()``."""
    return Capture(model)


class _GradSink:
    """Where the hooks on the step's tensors put their gradients: all that a tensor the step's code
    keeps holds of the capture (a hook is not removed: it goes with the step's autograd graph)."""

    __slots__ = ("grads", "open")

    def __init__(self, grads: dict[int, Any]) -> None:
        self.grads = grads
        self.open = True

    def __call__(self, node: int, grad: Any) -> None:
        if grad is not None and self.open:
            self.grads[node] = grad


class _Nodes:
    """The recorded nodes, a column each (no object per node: a step of many calls would otherwise
    make Python's cycle collector run more often, and look through them each time)."""

    __slots__ = ("attrs", "consts", "flat", "names", "starts", "tags", "values")

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.starts: list[int] = []  # where each node's parents start in ``flat``
        self.flat: list[int] = []  # the parents of every node, one node's after another's
        #: Each node's value: a torch.Tensor, an array the capture made, or None (a node whose
        #: value a replay computes).
        self.values: list[Any] = []
        self.names: list[str] = []
        self.attrs: dict[int, dict[str, Any]] = {}
        self.consts: list[bool] = []  # whose value is a const (folded, whatever the node's tag)

    def __len__(self) -> int:
        return len(self.tags)

    def add(
        self, tag: str, parents: Sequence[int], value: Any, name: str, attrs: dict[str, Any] | None, const: bool
    ) -> int:
        node = len(self.tags)
        self.tags.append(tag)
        self.starts.append(len(self.flat))
        self.flat.extend(parents)
        self.values.append(value)
        self.names.append(name)
        if attrs:
            self.attrs[node] = attrs
        self.consts.append(const)
        return node


class Capture:
    """A capture of one step; use :func:`capture`."""

    def __init__(self, model: Any = None) -> None:
        self._model = model
        self._nodes = _Nodes()
        self._grads: dict[int, Any] = {}
        self._graph: Graph | None = None
        self._state = "new"
        self._failure: str | None = None  # the name of what the step raised

    # -- the with block ------------------------------------------------------------------------------
    def __enter__(self) -> Capture:
        if self._state != "new":
            raise CaptureError("a capture records one step: start a new capture() for the next one")
        if _ACTIVE:
            raise CaptureError("another capture is running (on this thread or another): capture one step at a time")
        try:
            import torch
        except ModuleNotFoundError:
            raise CaptureError(
                'capture records PyTorch steps and PyTorch is not installed: pip install ".[torch]" in '
                "graphsvc's checkout (or pip install torch)"
            ) from None

        self._torch = torch
        self._tensor_type = torch.Tensor
        self._current_node = torch._C._current_autograd_node
        self._grad_enabled = torch.is_grad_enabled
        self._no_grad: list[int] = []  # nodes an op made with gradients off (torch.no_grad())
        # id(tensor) -> (tensor, node, version): tensors by identity. It holds the tensors it maps (as
        # the nodes hold their values) until the capture ends, so an id is not reused for another
        # tensor meanwhile; cheaper than ``torch.utils.weak.WeakIdKeyDictionary``, which makes a weak
        # reference on every lookup. A version of -1 is set at the next call (:meth:`_settle`).
        self._known: dict[int, tuple[Any, int, int]] = {}
        self._floating = _floating_dtypes()
        self._kept_dtypes = _kept_dtypes()
        self._scalars: dict[tuple[Any, ...], np.ndarray] = {}  # see _Call.scalar
        self._uncopied: dict[int, list[int]] = {}
        self._unindexed: list[int] = []  # nodes with a value not yet in _uncopied (see _protect)
        self._fresh: list[tuple[Any, int]] = []
        self._leaves: dict[int, Any] = {}
        self._accumulating: set[int] = set()
        self._uncopied_grads: dict[int, list[int]] = {}
        self._hooks: list[Callable[[], Any]] = []  # what takes each leaf's hook out
        self._names: set[str] = set()
        self._name_counts: dict[str, int] = {}
        self._inputs = itertools.count()
        self._quiet = 0
        self._done = False
        self._sink = _GradSink(self._grads)
        self._backwards: list[tuple[Any, Any]] = []
        self._available = _available_ops()
        self._leaf_names: dict[int, str] = {}
        self._paths: dict[int, str] = {}
        self._stack: list[str] = [""]
        self._ran: dict[str, None] = {}  # the module paths the step ran
        self._leaf_refs: list[Any] = []  # what _leaf_names names, held so that no id is reused
        if self._model is not None:
            self._name_model(self._model)
        self._state = "running"
        self._thread = threading.get_ident()
        self._undo: list[Callable[[], object]] = []
        with _STARTING:  # two threads starting captures at once: the second one sees the first
            if _ACTIVE:
                self._state = "new"
                raise CaptureError("another capture is running (on this thread or another): capture one step at a time")
            try:
                self._patch(torch)
            except BaseException:
                self._unpatch()
                self._state = "done"
                raise
        return self

    def _name_model(self, model: Any) -> None:
        """The names of the model's parameters, buffers and modules, as ``named_parameters()``,
        ``named_buffers()`` and ``named_modules()`` give them (in one walk of the modules where
        neither the model's class nor the model itself has its own of those, :data:`_NAMING`)."""
        names, refs, paths = self._leaf_names, self._leaf_refs, self._paths
        module_class, plain_class = type(model), self._torch.nn.Module
        plain = all(getattr(module_class, f) is getattr(plain_class, f) for f in _NAMING)
        if not plain or any(f in vars(model) for f in _NAMING):  # the class's, or the model's own
            for name, t in model.named_parameters(remove_duplicate=True):
                names.setdefault(id(t), name)
                refs.append(t)
            for name, t in model.named_buffers(remove_duplicate=True):
                names.setdefault(id(t), name)
                refs.append(t)
            for name, module in model.named_modules():
                paths.setdefault(id(module), name)
            return
        # as Module._named_members: the modules in named_modules' order, a tensor seen twice named once
        seen_parameters: set[int] = set()
        seen_buffers: set[int] = set()
        buffers: list[tuple[str, Any]] = []
        for path, module in model.named_modules():
            paths.setdefault(id(module), path)
            prefix = f"{path}." if path else ""
            for key, t in module._parameters.items():
                if t is not None and id(t) not in seen_parameters:
                    seen_parameters.add(id(t))
                    names.setdefault(id(t), prefix + key)
                    refs.append(t)
            for key, t in module._buffers.items():
                if t is not None and id(t) not in seen_buffers:
                    seen_buffers.add(id(t))
                    buffers.append((prefix + key, t))
        for name, t in buffers:  # after every parameter, as named_buffers() after named_parameters()
            names.setdefault(id(t), name)
            refs.append(t)

    def _patch(self, torch: Any) -> None:
        """Put the capture's hooks, wrappers and mode in place, each with its undoing in
        ``self._undo`` as soon as it is done (so a failure half way leaves PyTorch as it was)."""
        modules = torch.nn.modules.module
        handle = modules.register_module_forward_pre_hook(self._enter_module)
        self._undo.append(handle.remove)
        handle = modules.register_module_forward_hook(self._leave_module, always_call=True)
        self._undo.append(handle.remove)
        self._backward = backward = torch.autograd.backward
        function = torch.autograd.function.Function
        self._apply = apply = function.__dict__["apply"]
        _REAL.update(backward=backward, apply=apply)
        self._undo.append(functools.partial(setattr, torch.autograd, "backward", backward))
        torch.autograd.backward = _backward
        self._undo.append(functools.partial(setattr, function, "apply", apply))
        function.apply = _APPLY
        _ACTIVE.append(self)
        self._undo.append(functools.partial(_ACTIVE.remove, self))
        self._mode = mode = _mode_class()(self)
        mode.__enter__()
        self._undo.append(functools.partial(mode.__exit__, None, None, None))

    def _unpatch(self) -> None:
        """Undo what :meth:`_patch` did, last first; every step runs, and the first error (if any)
        is raised when all have."""
        error: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as exc:  # each step runs
                error = error or exc
        if error is not None:
            raise error

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        try:
            self._unpatch()
        finally:
            self._mode.capture = None
            for remove in self._hooks:  # the leaves' hooks (they hold the capture)
                remove()
            self._state = "done"
        self._sink.open = False  # a later backward over the step's tensors keeps nothing
        try:
            if exc is not None:
                self._failure = type(exc).__name__  # not the exception: its traceback holds the step's frames
                return
            self._graph = self._build()
        finally:  # the step's tensors go, whether the graph was made or not
            self._nodes = _Nodes()
            self._grads = self._sink.grads = {}
            self._known, self._fresh, self._backwards, self._leaves = {}, [], [], {}
            self._leaf_refs, self._hooks, self._uncopied, self._uncopied_grads = [], [], {}, {}
            self._scalars = {}

    def graph(self) -> Graph:
        """The recorded step as a Graph: the loss is its output (none when no backward ran)."""
        if self._state == "running":
            raise CaptureError("run.graph() is ready when the `with capture(...)` block has ended")
        if self._graph is None:
            why = f": the step raised {self._failure}" if self._failure is not None else ""
            raise CaptureError(f"nothing was captured{why}")
        return self._graph

    # -- module paths (global module hooks: they see every thread's module calls) ---------------------
    def _enter_module(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        path = self._paths.get(id(module))
        if path is None:  # a module outside the model: named by its class under the current path
            top = self._stack[-1]
            path = f"{top}.{type(module).__name__}" if top else type(module).__name__
        self._stack.append(path)
        self._ran[path] = None

    def _leave_module(self, module: Any, args: Any, output: Any) -> None:
        if len(self._stack) > 1 and threading.get_ident() == self._thread:
            self._stack.pop()

    # -- the dispatch ---------------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plan = _plan(func)
        if self._quiet or self._done or self._current_node() is not None:
            if plan.writes:
                self._protect(plan, args, kwargs)
            return plan.call(*args, **kwargs)
        if self._fresh:
            self._settle()
        if plan.inplace and args and isinstance(args[0], self._tensor_type):
            return self._inplace(func, plan, args, kwargs)
        parents = self._inputs_of(func, args, kwargs)
        if plan.writes:
            self._protect(plan, args, kwargs)
        out = plan.call(*args, **kwargs)
        if plan.refused:  # out= variants and the like: the changed argument is not rebound
            raise CaptureError(f"capture cannot record {func}: it writes into an argument")
        if self._grad_enabled():
            self._record(func, plan, args, kwargs, out, parents)
        else:  # under torch.no_grad(): what it makes is a constant to autograd (see _build)
            before = len(self._nodes)
            self._record(func, plan, args, kwargs, out, parents)
            self._own_nodes(func, plan, args, out, parents, before)
            self._no_grad.extend(range(before, len(self._nodes)))
        return out

    def _own_nodes(
        self, func: Any, plan: _Plan, args: tuple[Any, ...], out: Any, parents: dict[int, int], before: int
    ) -> None:
        """Under torch.no_grad(), an output recorded as the node of an argument that requires grad
        (a clone, an alias, a view to its own shape: the same node) gets a node of its own, an
        identity ``reshape``, which the graph then cuts from that argument as PyTorch's backward
        does (see _build): else the gradient would flow through it in a replay."""
        kind, known, consts = self._tensor_type, self._known, self._nodes.consts
        grad_nodes = {parents[id(a)] for a in args if isinstance(a, kind) and a.requires_grad}
        for t in _outputs(out, kind):
            entry = known.get(id(t))
            if entry is not None and entry[0] is t and entry[1] < before and entry[1] in grad_nodes:
                if not consts[entry[1]]:
                    self._new("reshape", [entry[1]], t, self._op_name(plan.label), func, {"shape": list(t.shape)})

    def _inplace(self, func: Any, plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self_ = args[0]
        parents = self._inputs_of(func, args, kwargs)
        view = self_._is_view()
        self._protect(plan, args, kwargs)
        out = plan.call(*args, **kwargs)
        leaf = parents[id(self_)]
        if not view and self._leaves.get(leaf) is self_ and not self._grad_enabled():
            # a leaf changed under torch.no_grad() (a weight normalized by hand, a lazy module's
            # initialization): to PyTorch's backward the same leaf with a new value, which takes the
            # leaf's name and gradient; the value before is ``<name>.before``
            name = self._nodes.names[leaf]
            self._nodes.names[leaf] = self._unique(f"{name}.before")
            node = self._new(LEAF, [], self_, name, func)
            del self._leaves[leaf]
            self._leaves[node] = self_
            self._hooks.append(_hook(self_, -1 - node, functools.partial(self._leaf_hook, node)))
            return out
        functional = plan.functional
        if functional is None:
            raise CaptureError(f"capture cannot record {func}: it has no functional form to record")
        before = len(self._nodes)
        self._record(functional, _plan(functional), args, kwargs, self_, parents)
        node = self._known[id(self_)][1]
        if view and (len(self._nodes) == before or not self._nodes.consts[node]):
            raise CaptureError(
                f"capture cannot record {func} on a view of another tensor (a slice, a transpose): "
                "a graph of functional ops cannot hold a change through a view; change a copy instead"
            )
        return out

    def _inputs_of(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, int]:
        """The node of every tensor argument (new leaves made for tensors seen for the first time):
        id(tensor) -> node."""
        nodes: dict[int, int] = {}
        kind, known = self._tensor_type, self._known
        for value in itertools.chain(args, kwargs.values()) if kwargs else args:
            if isinstance(value, kind):
                key = id(value)
                entry = known.get(key)
                if entry is not None and entry[0] is value and (entry[2] < 0 or value._version == entry[2]):
                    nodes[key] = entry[1]  # the common case, written out
                elif key not in nodes:
                    nodes[key] = self._input(value, func)
            elif isinstance(value, (list, tuple)):
                for t in value:
                    if isinstance(t, kind) and id(t) not in nodes:
                        nodes[id(t)] = self._input(t, func)
        return nodes

    def _input(self, t: Any, func: Any) -> int:
        """The node of a tensor argument: the one it was recorded as, or a new leaf."""
        entry = self._known.get(id(t))
        if entry is None or entry[0] is not t:
            return self._leaf(t, func)
        if entry[2] >= 0 and t._version != entry[2]:
            raise CaptureError(
                f"capture cannot record {func}: an argument was changed in place through another view "
                "of its memory after it was recorded; change a copy instead"
            )
        return entry[1]

    def _leaf(self, t: Any, func: Any) -> int:
        """A new leaf for a tensor the step did not make (a parameter, a buffer, an input)."""
        name = self._leaf_names.get(id(t))
        if name is None:
            name = f"input{next(self._inputs)}"
        node = self._new(LEAF, [], t, self._unique(name), func)
        self._known[id(t)] = (t, node, t._version)
        if t.requires_grad and t.dtype in self._floating:
            self._leaves[node] = t
            self._hooks.append(_hook(t, -1 - node, functools.partial(self._leaf_hook, node)))
        return node

    def _new(
        self,
        tag: str,
        parents: Sequence[int],
        value: Any,
        name: str,
        func: Any,
        attrs: dict[str, Any] | None = None,
        const: bool = False,
    ) -> int:
        if value is not None and value.dtype not in self._kept_dtypes:
            _check_dtype(value, func)
        node = self._nodes.add(tag, parents, value, name, attrs, const)
        if value is not None:
            # its version is known at the next call (a view's is set after this one)
            self._known[id(value)] = (value, node, -1)
            self._fresh.append((value, node))
            self._unindexed.append(node)
        return node

    def _unique(self, base: str) -> str:
        names = self._names
        if base not in names:
            names.add(base)
            return base
        name = base
        while name in names:
            self._name_counts[base] = count = self._name_counts.get(base, 0) + 1
            name = f"{base}{count}"
        names.add(name)
        return name

    def _op_name(self, label: str) -> str:
        """A node's name: the module path, a dot and ``label`` (an op's name without its leading
        and trailing underscores, :attr:`_Plan.label`), made unique."""
        path = self._stack[-1]
        name = f"{path}.{label}" if path else label
        names = self._names
        if name in names:
            return self._unique(name)
        names.add(name)
        return name

    def _protect(self, plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Copy every recorded tensor on the memory an op is about to change. The recorded tensors
        are indexed by their memory here, when an op first writes after they were made: a step
        without in-place ops never looks for its tensors' memory."""
        uncopied = self._uncopied
        if self._unindexed:
            values = self._nodes.values
            for node in self._unindexed:
                value = values[node]
                if value is not None:
                    uncopied.setdefault(_memory(value), []).append(node)
            self._unindexed = []
        kind, values = self._tensor_type, self._nodes.values
        for at in plan.writes:
            written = args[at] if isinstance(at, int) and at < len(args) else kwargs.get(str(at))
            if isinstance(written, kind):
                written = (written,)
            elif not isinstance(written, (list, tuple)):  # a list of tensors: a _foreach_ op's
                continue
            for t in written:
                if not isinstance(t, kind):
                    continue
                where = _memory(t)
                for node in uncopied.pop(where, ()):
                    value = values[node]
                    if value is not None:
                        values[node] = value.detach().clone()
                for node in self._uncopied_grads.pop(where, ()):
                    self._grads[node] = self._grads[node].clone()

    def _settle(self) -> None:
        """The tensors the last call made, now that autograd has set them up: their versions, and
        a hook on each that has a gradient to come."""
        fresh, self._fresh = self._fresh, []
        known, sink = self._known, self._sink
        values, consts = self._nodes.values, self._nodes.consts
        for t, node in fresh:
            key = id(t)
            entry = known.get(key)
            if entry is None or entry[1] != node or entry[0] is not t:
                continue
            known[key] = (t, node, t._version)
            if values[node] is not t or consts[node]:
                continue
            if t.grad_fn is None:  # (a tensor with one is floating-point, or complex: refused when recorded)
                continue
            _hook(t, -1 - node, functools.partial(sink, node))  # it goes with the step's autograd graph

    def _leaf_hook(self, node: int, grad: Any) -> None:
        """A leaf's gradient, kept only when the leaf had one before (it adds to it): else it is
        ``.grad`` after the backward, which autograd can then take without a copy (it copies a
        gradient someone else holds)."""
        if grad is not None and not self._done and node in self._accumulating:
            self._grads[node] = grad

    # -- recording one call ---------------------------------------------------------------------------
    def _record(
        self, func: Any, plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, parents: dict[int, int]
    ) -> None:
        kind = self._tensor_type
        if isinstance(out, kind):
            outputs = [out]
        elif isinstance(out, (list, tuple)) and out and all(isinstance(t, kind) for t in out):
            outputs = list(out)
        else:
            return
        folded = True  # a factory's, or every input a const
        if not plan.factory:
            consts = self._nodes.consts
            for n in parents.values():
                if not consts[n]:
                    folded = False
                    break
        if folded and parents and plan.alias:  # a const's alias: the same const
            same = next(iter(parents.values()))
        call = _Call(self, func, plan, args, kwargs, outputs, parents)
        known, fresh = self._known, self._fresh
        for i, t in enumerate(outputs):
            if not folded:
                node = plan.handler(call, i)
                if node is None:
                    node = call.generic(i)
            elif parents and plan.alias:
                node = same
            else:
                node = self._new(CONST, [], t, self._op_name(plan.label), func, const=True)
            entry = known.get(id(t))
            if entry is None or entry[1] != node or entry[0] is not t:  # a tensor that is the same node as another
                known[id(t)] = (t, node, -1)
                fresh.append((t, node))

    # -- backward and custom Functions -----------------------------------------------------------------
    def _wrapped_backward(self, tensors: Any, grad_tensors: Any = None, *rest: Any, **kwargs: Any) -> Any:
        if self._quiet:
            return self._backward(tensors, grad_tensors, *rest, **kwargs)
        if self._done:  # a second backward: counted (the graph refuses it), its gradients not kept
            self._backwards.append((tensors, grad_tensors))
            return self._backward(tensors, grad_tensors, *rest, **kwargs)
        if self._fresh:
            self._settle()
        self._backwards.append((tensors, grad_tensors))
        self._accumulating = {node for node, t in self._leaves.items() if t.grad is not None}
        self._quiet += 1
        # The backward runs outside the dispatch mode (a Python call for each of its ATen calls
        # costs a third of a transformer layer's step): nothing in it is recorded, and what it writes is
        # memory the capture does not hold (a gradient a hook kept is never accumulated into in
        # place: autograd does that only to a tensor no one else holds). Only when the mode is the
        # innermost one: another mode entered inside the block stays as it is.
        outside = _innermost_mode() is self._mode
        if outside:
            self._mode.__exit__(None, None, None)
        try:
            return self._backward(tensors, grad_tensors, *rest, **kwargs)
        finally:
            if outside:
                self._mode.__enter__()
            self._quiet -= 1
            self._done = True
            self._sink.open = False
            for node, t in self._leaves.items():
                if node not in self._accumulating and t.grad is not None:
                    self._grads[node] = t.grad
            for node, g in self._grads.items():  # copied before anything changes them in place
                self._uncopied_grads.setdefault(_memory(g), []).append(node)

    def _wrapped_apply(self, cls: Any, *args: Any, **kwargs: Any) -> Any:
        apply = self._apply.__func__
        if self._quiet or self._done or self._current_node() is not None:
            return apply(cls, *args, **kwargs)
        if self._fresh:
            self._settle()
        tag = f"{cls.__module__}.{cls.__qualname__}"
        parents = self._inputs_of(tag, args, kwargs)
        self._quiet += 1
        try:
            out = apply(cls, *args, **kwargs)
        finally:
            self._quiet -= 1
        try:
            attrs, tensors = encode_call(args, kwargs, self._is_tensor)
        except UnencodableArgument as exc:
            raise CaptureError(f"capture cannot record {tag}: {exc}") from None
        if not kwargs and all(isinstance(a, self._tensor_type) for a in args):
            attrs = {}  # tensors only: the op takes its inputs and no attributes
        outputs = _outputs(out, self._tensor_type)
        before = len(self._nodes)
        for i, t in enumerate(outputs):
            more = dict(attrs, output=i) if len(outputs) > 1 else attrs
            name = self._op_name(cls.__name__.strip("_") or cls.__name__)
            self._new(tag, [parents[id(p)] for p in tensors], t, name, tag, attrs=more or None)
        if not self._grad_enabled():  # applied under torch.no_grad(): a constant to the backward
            self._no_grad.extend(range(before, len(self._nodes)))
        return out

    def _is_tensor(self, value: object) -> bool:
        return isinstance(value, self._tensor_type)

    # -- the graph -------------------------------------------------------------------------------------
    def _build(self) -> Graph:
        if len(self._backwards) > 1:
            raise CaptureError(f"a capture records one step with one backward; this one ran {len(self._backwards)}")
        torch = self._torch
        output: int | None = None
        nodes = self._nodes
        data = {n for n, tag in enumerate(nodes.tags) if tag == LEAF and n not in self._leaves}
        cut: set[int] = set()  # nodes that are consts to the backward: their parents are not theirs
        if self._backwards:
            output = self._output(*self._backwards[0])
        if output is not None:
            outputs = [output]
            # what an op made under torch.no_grad() is a constant to PyTorch's backward: to a
            # replay's too (a step without backward keeps its ops: there is no gradient to hold)
            cut = set(self._no_grad)
            data |= cut
        else:  # no backward: the results are the ops' values nothing else used
            used = set(nodes.flat)
            outputs = [n for n, tag in enumerate(nodes.tags) if n not in used and tag not in (CONST, LEAF)]
        keep = _ancestors(nodes, outputs, cut)
        # the capture's own references, dropped: what is left in use is someone else's (the values
        # of nodes the graph does not keep go too: a detached alias of a kept value holds its memory)
        self._fresh, self._backwards, self._leaves, self._known = [], [], {}, {}
        kept = set(keep)
        values, all_grads = nodes.values, self._grads
        for node in range(len(nodes)):
            if node not in kept:
                values[node] = None
                all_grads.pop(node, None)
        private = self._private(keep)
        tags: list[str] = []
        counts: list[int] = []
        parents: list[int] = []
        names: dict[int, str] = {}
        attrs: dict[int, dict[str, Any]] = {}
        arrays: dict[int, np.ndarray] = {}
        grads: dict[int, np.ndarray] = {}
        ids: dict[int, int] = {}
        copies: dict[tuple[Any, ...], tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]] = {}
        all_tags, all_names, all_attrs, starts, flat = nodes.tags, nodes.names, nodes.attrs, nodes.starts, nodes.flat
        ends = [*starts[1:], len(flat)]
        # the copies in memory an earlier graph gave back, as a replay's arrays: the pages a freed
        # graph's copies touched, not fresh ones (a page fault each)
        with memory.reuse():
            for new, old in enumerate(keep):
                ids[old] = new
                tag = all_tags[old]
                tags.append(CONST if old in data else tag)
                start, end = (starts[old], starts[old]) if old in cut else (starts[old], ends[old])
                counts.append(end - start)
                if end > start:
                    parents.extend([ids[p] for p in flat[start:end]])
                names[new] = all_names[old]
                if old in all_attrs and old not in cut:
                    attrs[new] = all_attrs[old]
                value = values[old]
                if value is not None:
                    arrays[new] = array = _kept(value, private, copies)
                    grad = all_grads.get(old)
                    if grad is not None and tags[-1] != CONST and grad.shape == array.shape:
                        grads[new] = _kept(grad, private, copies)
        value = grad = None  # no reference of ours left in a variable
        metadata: dict[str, Any] = {"torch": str(torch.__version__)}
        if self._model is not None:
            metadata["model"] = type(self._model).__name__
            # counted now: a lazy module's parameters have their shapes only after its first call
            metadata["parameters"] = sum(int(p.numel()) for p in self._model.parameters())
        # the model's modules (a parameter's place, whether its module's forward ran or, as an
        # attention's out_proj, only its weights were used) and those outside it the step ran
        modules = dict.fromkeys(path for path in self._paths.values() if path)  # the model itself is ""
        metadata["modules"] = [*modules, *(path for path in self._ran if path and path not in modules)]
        graph = graph_from_lists(
            tags,
            counts,
            parents,
            itertools.repeat(math.nan, len(tags)),
            names=names,
            attrs=attrs,
            arrays=arrays,
            grad_arrays=grads,
            outputs=[ids[n] for n in outputs],
            metadata={"captured": metadata},
        )
        # the compiled check whatever the graph's size (microseconds, where numpy's cost tens of them)
        graph.check(compiled_checks(), arrays_checked=True)
        return graph

    def _private(self, nodes: list[int]) -> set[int]:
        """The tensors (by id) of ``nodes``' values and gradients that only this capture uses: made
        by the step's ops (not a parameter, an input, a ``p.grad``), no one else holding them (the
        Python object) or their memory (another tensor on it: a view the step's code keeps, a
        tensor autograd still saves). No one can change those, so the graph may keep them without a
        copy."""
        torch = self._torch
        # id -> how many references the capture holds (ids of what is not a tensor count too, and
        # are never looked up: the tensors below are alive, so no id of theirs is another object's)
        ours = collections.Counter(map(id, self._nodes.values))
        ours.update(map(id, self._grads.values()))
        tensors: dict[int, Any] = {}  # id -> tensor: the step's op's values and gradients
        tags, values = self._nodes.tags, self._nodes.values
        for node in nodes:
            if tags[node] == LEAF:
                continue
            for t in (values[node], self._grads.get(node)):
                if isinstance(t, torch.Tensor) and t.is_cpu:
                    tensors[id(t)] = t
        t = None  # no reference of ours left in a variable
        private: set[int] = set()
        groups: dict[int, dict[int, Any]] = {}
        use_count, refcount = torch._C._storage_Use_Count, sys.getrefcount
        for key in tensors:
            one = tensors[key]
            storage = one.untyped_storage()
            if one._base is None and use_count(storage._cdata) == 2:
                # alone on its memory (its users: `one` and `storage`): _unshared's test made short;
                # one's references: `tensors`, `one`, getrefcount's argument and the capture's
                if refcount(one) - 3 <= ours.get(key, 0):
                    private.add(key)
            else:
                groups.setdefault(storage.data_ptr(), {})[key] = one
        one = storage = None
        tensors.clear()  # the groups' tensors are referred to by their group alone (_unshared counts)
        for group in groups.values():
            if self._unshared(group, ours):
                private.update(group)
        return private

    def _unshared(self, group: dict[int, Any], ours: dict[int, int]) -> bool:
        """Whether the tensors of ``group`` (id -> tensor, all on one memory) and that memory are
        held by no one but the capture: every tensor on the memory is one of them or the base of one
        of their views (a view holds its base), and no tensor has a reference the capture cannot
        account for. All or none: a view someone holds can change the memory under the others."""
        torch = self._torch
        bases: dict[int, Any] = {}
        viewed: set[int] = set()
        for t in group.values():
            base = t._base
            if base is not None:
                viewed.add(id(base))
                if id(base) not in group:
                    bases[id(base)] = base
        del base
        storage = next(iter(group.values())).untyped_storage()
        if torch._C._storage_Use_Count(storage._cdata) - 1 != len(group) + len(bases):  # -1: `storage`
            return False
        # A tensor that C++ code holds (a view holds its base) has one Python reference for all of
        # them; getrefcount's argument, the dict's entry and the loop's variable are the others
        # (keys, not items(): a dict's items iterator keeps its last pair).
        for tensors in (group, bases):
            for key in tensors:
                t = tensors[key]
                if sys.getrefcount(t) - 3 > ours.get(key, 0) + (key in viewed):
                    return False
        return True

    def _output(self, tensors: Any, grad_tensors: Any) -> int:
        torch = self._torch
        if isinstance(tensors, (list, tuple)):
            if len(tensors) != 1:
                raise CaptureError(f"a capture records a backward from one tensor; this one was from {len(tensors)}")
            tensors = tensors[0]
            if isinstance(grad_tensors, (list, tuple)):
                grad_tensors = grad_tensors[0] if grad_tensors else None
        known = self._known.get(id(tensors)) if isinstance(tensors, torch.Tensor) else None
        if known is None or known[0] is not tensors:
            raise CaptureError("the backward ran from a tensor the capture did not see made")
        node = known[1]
        seed = None if grad_tensors is None else grad_tensors.detach()
        if seed is None or (tensors.dim() == 0 and bool((seed == 1).all())):
            if node not in self._grads and tensors.dim() == 0:
                self._grads[node] = np.ones((), dtype=_numpy(tensors).dtype)
            return node
        value = _numpy(tensors)
        seed_node = self._new_detached(CONST, [], seed, "backward.seed", const=True)
        mul = self._new_detached("mul", [node, seed_node], tensors * seed, "backward.mul")
        total = self._new_detached("sum", [mul], (tensors * seed).sum(), "backward.sum")
        self._grads[mul] = np.ones(value.shape, dtype=value.dtype)
        self._grads[total] = np.ones((), dtype=value.dtype)
        return total

    def _new_detached(self, tag: str, parents: list[int], value: Any, name: str, const: bool = False) -> int:
        return self._nodes.add(tag, parents, value.detach(), self._unique(name), None, const)


# -- calls and how each op is written ---------------------------------------------------------------------
class _Call:
    """One recorded call, as the op handlers see it."""

    __slots__ = ("args", "capture", "func", "kwargs", "outputs", "parents", "plan")

    def __init__(
        self,
        capture: Capture,
        func: Any,
        plan: _Plan,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        outputs: list[Any],
        parents: dict[int, int],
    ) -> None:
        self.capture, self.func, self.plan = capture, func, plan
        self.args, self.kwargs, self.outputs, self.parents = args, kwargs, outputs, parents

    def arg(self, position: int, name: str, default: Any = None) -> Any:
        if position < len(self.args):
            return self.args[position]
        return self.kwargs.get(name, default)

    def node(self, t: Any) -> int:
        return self.parents[id(t)]

    def has(self, op: str) -> bool:
        return op in self.capture._available

    def emit(self, tag: str, parents: Sequence[int], i: int, attrs: dict[str, Any] | None = None) -> int:
        c = self.capture
        return c._new(tag, parents, self.outputs[i], c._op_name(self.plan.label), self.func, attrs)

    def inner(self, tag: str, parents: Sequence[int], attrs: dict[str, Any] | None = None, *, suffix: str) -> int:
        """A node of a decomposition, whose value a replay computes (PyTorch had no such tensor)."""
        c = self.capture
        return c._nodes.add(tag, parents, None, c._op_name(f"{self.plan.label}.{suffix}"), attrs, False)

    def const(self, value: np.ndarray, suffix: str) -> int:
        c = self.capture
        return c._nodes.add(CONST, (), value, c._op_name(f"{self.plan.label}.{suffix}"), None, True)

    def scalar(self, value: Any, i: int) -> int:
        """A Python number operand as a 0-d const of the output's dtype (the consts of one number
        and dtype share their array: a step's ``x * 0.5`` in a loop makes one; not zeros, whose sign
        a key does not tell; a nan object finds only itself, each new one gets its own)."""
        dtype = self.outputs[i].dtype
        scalars = self.capture._scalars
        key = (type(value), value, dtype)
        array = scalars.get(key) if value else None
        if array is None:
            try:
                array = np.array(value, dtype=_numpy_dtype(dtype))
            except OverflowError:
                name = str(dtype).removeprefix("torch.")
                why = f"its number {value} does not fit {name}"
                raise CaptureError(f"capture cannot record {self.func}: {why}") from None
            if value:
                scalars[key] = array
        return self.const(array, "scalar")

    def operand(self, value: Any, i: int) -> int:
        return self.node(value) if isinstance(value, self.capture._tensor_type) else self.scalar(value, i)

    def generic(self, i: int) -> int:
        try:
            attrs, tensors = encode_call(self.args, self.kwargs, self.capture._is_tensor)
        except UnencodableArgument as exc:
            raise CaptureError(f"capture cannot record {self.func}: {exc}") from None
        if len(self.outputs) > 1:
            attrs["output"] = i
        return self.emit(str(self.func), [self.node(t) for t in tensors], i, attrs)


Handler = Callable[[_Call, int], "int | None"]


@dataclass(slots=True, frozen=True)
class _Plan:
    """How calls of one ATen operator overload are recorded (made once per overload)."""

    #: The name its nodes are named by: the op's (its functional form's, for an in-place op)
    #: without leading and trailing underscores.
    label: str
    handler: Handler
    writes: tuple[int | str, ...]
    inplace: bool
    functional: Any
    #: The op writes into an argument it does not return (an out= variant): refused.
    refused: bool
    #: A factory or random op: its result is a const whatever its arguments.
    factory: bool
    #: An alias of its first argument (``alias``, ``detach``...): a const's alias is that const.
    alias: bool
    #: The operator itself: what calling the OpOverload calls (one Python call less).
    call: Callable[..., Any]


#: id(operator) -> (operator, its plan): looked up by id (an OpOverload's hash is Python code),
#: the operator kept so that its id is not another object's.
_PLANS: dict[int, tuple[Any, _Plan]] = {}


def _plan(func: Any) -> _Plan:
    """The plan of an ATen operator overload, made at its first call."""
    known = _PLANS.get(id(func))
    if known is None or known[0] is not func:
        known = _PLANS[id(func)] = (func, _make_plan(func))
    return known[1]


def _make_plan(func: Any) -> _Plan:
    import torch

    name = func.overloadpacket.__name__
    writes: list[int | str] = []
    for at, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            writes.append(at if not argument.kwarg_only else argument.name)
    refused = bool(writes) and not (name.endswith("_") and writes[:1] == [0])
    writes.extend(_HIDDEN_WRITES.get(name, ()))
    inplace = name.endswith("_") and not name.startswith("_") and writes[:1] == [0]
    functional = None
    base = name.rstrip("_") if inplace else name
    if inplace:
        packet = getattr(torch.ops.aten, base, None)
        overload = func._overloadname
        if packet is not None:
            for candidate in (overload, "default", "int", "Tensor", "Scalar"):
                functional = getattr(packet, candidate, None)
                if functional is not None:
                    break
    handler = _MAPPED.get(f"{base}.{func._overloadname}") or _MAPPED.get(base) or _no_mapping
    label = base.strip("_") or base
    factory = base in _FACTORIES
    alias = handler in (_same, _detach)
    # OpOverload.__call__ calls _op: called directly (a subclass's __call__, a TorchBind op's, is kept)
    call = func._op if type(func).__call__ is torch._ops.OpOverload.__call__ else func
    return _Plan(label, handler, tuple(writes), inplace, functional, refused, factory, alias, call)


def _no_mapping(call: _Call, i: int) -> int | None:
    return None


def _same(call: _Call, i: int) -> int | None:
    return call.node(call.args[0])


def _detach(call: _Call, i: int) -> int | None:
    x = call.args[0]
    if x.requires_grad:  # a stop-gradient: the value, as a const
        c = call.capture
        return c._new(CONST, [], call.outputs[i], c._op_name("detach"), call.func, const=True)
    return call.node(x)


def _to_copy(call: _Call, i: int) -> int | None:
    x, out = call.args[0], call.outputs[i]
    return call.node(x) if x.dtype == out.dtype else None


def _unary(tag: str) -> Handler:
    def handler(call: _Call, i: int) -> int | None:
        return call.emit(tag, [call.node(call.args[0])], i)

    return handler


def _binary(tag: str, *, reverse: bool = False) -> Handler:
    def handler(call: _Call, i: int) -> int | None:
        args, kwargs = call.args, call.kwargs
        x, y = args[0], args[1]
        if kwargs and (kwargs.get("alpha", 1) != 1 or kwargs.get("rounding_mode") is not None):
            return None
        if len(args) > 2 and args[2] != 1:
            return None
        kind, dtype = call.capture._tensor_type, call.outputs[i].dtype
        if (isinstance(x, kind) and x.dtype != dtype) or (isinstance(y, kind) and y.dtype != dtype):
            return None
        if reverse:
            x, y = y, x
        return call.emit(tag, [call.operand(x, i), call.operand(y, i)], i)

    return handler


def _matmul(call: _Call, i: int) -> int | None:
    return call.emit("matmul", [call.node(call.args[0]), call.node(call.args[1])], i)


def _transpose_t(call: _Call, i: int) -> int | None:
    x = call.args[0]
    return call.emit("transpose", [call.node(x)], i) if x.dim() == 2 else call.node(x)


def _transpose(call: _Call, i: int) -> int | None:
    x = call.args[0]
    axes = list(range(x.dim()))
    if not axes:
        return call.node(x)
    a, b = call.arg(1, "dim0") % x.dim(), call.arg(2, "dim1") % x.dim()
    axes[a], axes[b] = axes[b], axes[a]
    return call.emit("transpose", [call.node(x)], i, {"axes": axes})


def _permute(call: _Call, i: int) -> int | None:
    x = call.args[0]
    return call.emit("transpose", [call.node(x)], i, {"axes": [d % x.dim() for d in call.arg(1, "dims")]})


def _reshape(call: _Call, i: int) -> int | None:
    x, out = call.args[0], call.outputs[i]
    if tuple(x.shape) == tuple(out.shape):
        return call.node(x)
    return call.emit("reshape", [call.node(x)], i, {"shape": list(out.shape)})


def _expand(call: _Call, i: int) -> int | None:
    x, out = call.args[0], call.outputs[i]
    if tuple(x.shape) == tuple(out.shape):
        return call.node(x)
    return call.emit("broadcast_to", [call.node(x)], i, {"shape": list(out.shape)})


def _addmm(call: _Call, i: int) -> int | None:
    bias, m1, m2 = call.args[:3]
    beta, alpha = call.arg(3, "beta", 1), call.arg(4, "alpha", 1)
    parents = [call.node(bias), call.node(m1), call.node(m2)]
    if call.has("addmm"):
        attrs = {k: float(v) for k, v in (("beta", beta), ("alpha", alpha)) if v != 1}
        return call.emit("addmm", parents, i, attrs or None)
    if beta != 1 or alpha != 1:
        return None
    product = call.inner("matmul", parents[1:], suffix="mm")
    return call.emit("add", [parents[0], product], i)


def _softmax(tag: str) -> Handler:
    def handler(call: _Call, i: int) -> int | None:
        x = call.args[0]
        if call.outputs[i].dtype != x.dtype:
            return None
        return call.emit(tag, [call.node(x)], i, {"axis": call.arg(1, "dim")})

    return handler


def _nll_loss(call: _Call, i: int) -> int | None:
    x, target, weight = call.args[0], call.args[1], call.arg(2, "weight")
    if i != 0 or weight is not None:
        return None
    attrs = {"reduction": _REDUCTIONS[call.arg(3, "reduction", 1)], "ignore_index": call.arg(4, "ignore_index", -100)}
    return call.emit("nll_loss", [call.node(x), call.node(target)], i, attrs)


def _dims(dim: Any) -> list[int] | None:
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return None
    return [dim] if isinstance(dim, int) else list(dim)


def _reduction(tag: str) -> Handler:
    def handler(call: _Call, i: int) -> int | None:
        x = call.args[0]
        if call.kwargs.get("dtype") is not None or call.outputs[i].dtype != x.dtype:
            return None
        attrs: dict[str, Any] = {}
        axis = _dims(call.arg(1, "dim"))
        if axis is not None:
            attrs["axis"] = axis
        if call.arg(2, "keepdim", False):
            attrs["keepdims"] = True
        return call.emit(tag, [call.node(x)], i, attrs or None)

    return handler


def _index(call: _Call, x: Any, axis: int, index: int, i: int) -> int:
    at = call.const(np.array(index % x.shape[axis], dtype=np.int64), "index")
    return call.emit("take", [call.node(x), at], i, {"axis": axis})


def _range(call: _Call, x: Any, axis: int, start: int, stop: int, step: int, i: int) -> int:
    size = x.shape[axis]
    if (start, stop, step) == (0, size, 1):
        return call.node(x)
    if call.has("slice"):
        return call.emit("slice", [call.node(x)], i, {"axis": axis, "start": start, "stop": stop, "step": step})
    at = call.const(np.arange(start, stop, step, dtype=np.int64), "range")
    return call.emit("take", [call.node(x), at], i, {"axis": axis})


def _select(call: _Call, i: int) -> int | None:
    x = call.args[0]
    return _index(call, x, call.arg(1, "dim") % x.dim(), call.arg(2, "index"), i)


def _unbind(call: _Call, i: int) -> int | None:
    x = call.args[0]
    return _index(call, x, call.arg(1, "dim", 0) % x.dim(), i, i)


def _slice(call: _Call, i: int) -> int | None:
    x = call.args[0]
    axis = call.arg(1, "dim", 0) % x.dim()
    start, stop, step = call.arg(2, "start"), call.arg(3, "end"), call.arg(4, "step", 1)
    start, stop, step = slice(start, stop, step).indices(x.shape[axis])
    return _range(call, x, axis, start, stop, step, i)


def _split(call: _Call, i: int) -> int | None:
    x = call.args[0]
    sizes = call.arg(1, "split_size")
    axis = call.arg(2, "dim", 0) % x.dim()
    if isinstance(sizes, int):
        starts = list(range(0, x.shape[axis], sizes)) if sizes else [0]
        sizes = [min(sizes, x.shape[axis] - s) for s in starts]
    start = sum(sizes[:i])
    return _range(call, x, axis, start, start + sizes[i], 1, i)


def _stack(call: _Call, i: int) -> int | None:
    tensors = call.args[0]
    out = call.outputs[i]
    axis = call.arg(1, "dim", 0) % out.dim()
    parents = [call.node(t) for t in tensors]
    if call.has("stack"):
        return call.emit("stack", parents, i, {"axis": axis})
    shape = list(out.shape)
    shape[axis] = 1
    pieces = [call.inner("reshape", [p], {"shape": shape}, suffix="reshape") for p in parents]
    return call.emit("concatenate", pieces, i, {"axis": axis})


def _cat(call: _Call, i: int) -> int | None:
    tensors = [t for t in call.args[0] if not (t.dim() == 1 and t.shape[0] == 0)]
    if not tensors:
        return None
    axis = call.arg(1, "dim", 0) % tensors[0].dim()
    return call.emit("concatenate", [call.node(t) for t in tensors], i, {"axis": axis})


def _embedding(call: _Call, i: int) -> int | None:
    weight, indices = call.args[0], call.args[1]
    padding_idx = call.arg(2, "padding_idx", -1)
    if (padding_idx is not None and padding_idx >= 0) or call.arg(3, "scale_grad_by_freq", False):
        return None
    return call.emit("take", [call.node(weight), call.node(indices)], i, {"axis": 0})


def _pow(call: _Call, i: int) -> int | None:
    return call.emit("pow", [call.node(call.args[0])], i, {"exponent": float(call.arg(1, "exponent"))})


def _convolution(call: _Call, i: int) -> int | None:
    x, w, b = call.args[0], call.args[1], call.arg(2, "bias")
    stride, padding, dilation = call.args[3], call.args[4], call.args[5]
    transposed, groups = call.args[6], call.args[8]
    if not call.has("conv2d") or x.dim() != 4 or transposed or groups != 1 or any(d != 1 for d in dilation):
        return None
    parents = [call.node(x), call.node(w)] + ([] if b is None else [call.node(b)])
    return call.emit("conv2d", parents, i, {"stride": list(stride), "padding": list(padding)})


def _max_pool2d(call: _Call, i: int) -> int | None:
    x = call.args[0]
    kernel = list(call.arg(1, "kernel_size"))
    stride = list(call.arg(2, "stride", []) or kernel)
    padding, dilation = call.arg(3, "padding", [0]), call.arg(4, "dilation", [1])
    if i != 0 or not call.has("max_pool2d") or call.arg(5, "ceil_mode", False) or any(d != 1 for d in dilation):
        return None
    pads = list(padding) * (2 if len(padding) == 1 else 1)
    attrs = {"kernel_size": kernel * (2 if len(kernel) == 1 else 1), "stride": stride * (2 if len(stride) == 1 else 1)}
    attrs["padding"] = pads
    return call.emit("max_pool2d", [call.node(x)], i, attrs)


def _batch_norm(call: _Call, i: int) -> int | None:
    x, w, b, mean, var = call.args[:5]
    training, eps = call.args[5], call.args[7]
    if i != 0 or not call.has("batch_norm") or w is None or b is None:
        return None
    parents = [call.node(x), call.node(w), call.node(b)]
    if not training:
        if mean is None or var is None:
            return None
        parents += [call.node(mean), call.node(var)]
    return call.emit("batch_norm", parents, i, {"training": bool(training), "eps": float(eps)})


def _layer_norm(call: _Call, i: int) -> int | None:
    x, shape, w, b, eps = call.args[:5]
    if i != 0 or not call.has("layer_norm") or w is None or b is None:
        return None
    attrs = {"normalized_shape": list(shape), "eps": float(eps)}
    return call.emit("layer_norm", [call.node(x), call.node(w), call.node(b)], i, attrs)


def _attention(call: _Call, i: int) -> int | None:
    q, k, v = call.args[:3]
    dropout, causal = call.arg(3, "dropout_p", 0.0), call.arg(4, "is_causal", False)
    mask, scale = call.kwargs.get("attn_mask"), call.kwargs.get("scale")
    if i != 0 or dropout or not call.has("scaled_dot_product_attention"):
        return None
    parents = [call.node(q), call.node(k), call.node(v)] + ([] if mask is None else [call.node(mask)])
    attrs: dict[str, Any] = {"is_causal": bool(causal)}
    if scale is not None:
        attrs["scale"] = float(scale)
    return call.emit("scaled_dot_product_attention", parents, i, attrs)


def _where(call: _Call, i: int) -> int | None:
    if not call.has("where"):
        return None
    return call.emit("where", [call.node(t) for t in call.args[:3]], i)


def _mse_loss(call: _Call, i: int) -> int | None:
    x, target = call.args[0], call.args[1]
    if not call.has("mse_loss") or x.dtype != target.dtype:
        return None
    attrs = {"reduction": _REDUCTIONS[call.arg(2, "reduction", 1)]}
    return call.emit("mse_loss", [call.node(x), call.node(target)], i, attrs)


def _clamp(call: _Call, i: int) -> int | None:
    low, high = call.arg(1, "min"), call.arg(2, "max")
    if not call.has("clamp") or (low is None and high is None):
        return None
    attrs = {key: float(v) for key, v in (("min", low), ("max", high)) if v is not None}
    return call.emit("clamp", [call.node(call.args[0])], i, attrs)


_MAPPED: dict[str, Handler] = {
    **{op: _unary(op) for op in "neg exp log sqrt sin cos tanh sigmoid relu abs".split()},
    **{op: _binary(op) for op in "add sub mul div".split()},
    "rsub.Scalar": _binary("sub", reverse=True),
    "pow.Tensor_Scalar": _pow,
    "mm": _matmul,
    "bmm": _matmul,
    "t": _transpose_t,
    "transpose": _transpose,
    "permute": _permute,
    **{op: _reshape for op in "view _unsafe_view unsqueeze squeeze reshape _reshape_alias flatten view_as".split()},
    "expand": _expand,
    "addmm": _addmm,
    "_log_softmax": _softmax("log_softmax"),
    "_softmax": _softmax("softmax"),
    "_safe_softmax": _softmax("softmax"),
    "nll_loss_forward": _nll_loss,
    "sum": _reduction("sum"),
    "mean": _reduction("mean"),
    "amax": _reduction("amax"),
    "select.int": _select,
    "slice.Tensor": _slice,
    "unbind.int": _unbind,
    **{op: _split for op in "split unsafe_split split_with_sizes unsafe_split_with_sizes".split()},
    "stack": _stack,
    "cat": _cat,
    "embedding": _embedding,
    "convolution": _convolution,
    "max_pool2d_with_indices": _max_pool2d,
    "native_batch_norm": _batch_norm,
    "native_layer_norm": _layer_norm,
    "_scaled_dot_product_flash_attention_for_cpu": _attention,
    "where.self": _where,
    "mse_loss": _mse_loss,
    "clamp.default": _clamp,
    **{op: _same for op in "alias clone contiguous lift_fresh".split()},
    "detach": _detach,
    "_to_copy": _to_copy,
}


# -- helpers --------------------------------------------------------------------------------------------------
#: The methods that name a model's parameters, buffers and modules: a model whose class (or itself)
#: has its own is asked by them.
_NAMING = ("named_parameters", "named_buffers", "named_modules", "_named_members", "parameters", "buffers")

#: The captures running, innermost last. ``torch.autograd.backward`` and ``Function.apply`` are
#: replaced by the functions below while one runs, not by a capture's bound methods: PyTorch code
#: that keeps a reference to what it found there (a class made by a lazy import during the step,
#: Dynamo's table of torch functions) then holds no capture and its graph for the life of the process.
_ACTIVE: list[Capture] = []
_STARTING = threading.Lock()  # held while a capture checks _ACTIVE and patches PyTorch
_REAL: dict[str, Any] = {}  # PyTorch's own backward and apply


def _running() -> Capture | None:
    """The innermost capture running on this thread (another thread's calls are not its step's)."""
    if _ACTIVE and _ACTIVE[-1]._thread == threading.get_ident():
        return _ACTIVE[-1]
    return None


def _hook(t: Any, key: int, hook: Callable[[Any], Any]) -> Callable[[], Any]:
    """``t.register_hook(hook)`` without its handle (most of what registering costs): what
    ``Tensor.register_hook`` does, under ``key`` (negative: no handle of the step's code has it,
    theirs count up from 0); a class that overrides ``register_hook`` is asked. What takes the
    hook out again."""
    if getattr(type(t), "register_hook", None) is not _tensor_register_hook():
        return t.register_hook(hook).remove
    hooks = t._backward_hooks
    if hooks is None:
        hooks = t._backward_hooks = collections.OrderedDict()
        if t.grad_fn is not None:
            t.grad_fn._register_hook_dict(t)
    hooks[key] = hook
    return functools.partial(hooks.pop, key, None)


@functools.cache
def _tensor_register_hook() -> Any:
    """``torch.Tensor.register_hook`` (a class with another is asked by it)."""
    import torch

    return torch.Tensor.register_hook


def _backward(*args: Any, **kwargs: Any) -> Any:
    capture = _running()
    if capture is not None:
        return capture._wrapped_backward(*args, **kwargs)
    return _REAL["backward"](*args, **kwargs)


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    capture = _running()
    if capture is not None:
        return capture._wrapped_apply(cls, *args, **kwargs)
    return _REAL["apply"].__func__(cls, *args, **kwargs)


_APPLY = classmethod(_apply)


def _innermost_mode() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


@functools.cache
def _mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    def handler(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.capture.dispatch(func, args, kwargs or {})

    skipped = _skipped_by_dynamo(handler.__code__)

    class _Mode(TorchDispatchMode):
        def __init__(self, capture: Capture) -> None:
            super().__init__()
            self.capture = capture

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # PyTorch wraps a mode's handler in torch._dynamo.disable (two more Python calls an ATen
            # call, and importing torch._dynamo, a second or more, at the first): not needed where
            # its code is marked to be skipped by Dynamo with all it calls
            return not skipped

        __torch_dispatch__ = handler

    return _Mode


def _skipped_by_dynamo(code: Any) -> bool:
    """Mark ``code`` so that Dynamo (``torch.compile``) never compiles it nor anything it calls, as
    ``torch._dynamo.disable(recursive=True)`` does, in PyTorch's C part (no torch._dynamo import);
    False where this PyTorch has no such mark."""
    import torch

    try:
        frames = torch._C._dynamo.eval_frame
        skip = frames._FrameAction.SKIP
        frames.set_code_exec_strategy(code, frames._FrameExecStrategy(skip, skip))
    except (AttributeError, TypeError, RuntimeError):
        return False
    return True


def _available_ops() -> frozenset[str]:
    """The op names the default registry has (builtins and installed plugins), made once for each
    registry and size (a registry only grows: a name registered twice is refused)."""
    from graphsvc.pluginhost import default_registry

    registry = default_registry()
    known = _AVAILABLE.get("ops")
    if known is None or known[0] is not registry or known[1] != len(registry):
        known = _AVAILABLE["ops"] = (registry, len(registry), frozenset(op.name for op in registry))
    return known[2]


_AVAILABLE: dict[str, tuple[Any, int, frozenset[str]]] = {}


def _outputs(out: Any, kind: type) -> list[Any]:
    if isinstance(out, kind):
        return [out]
    if isinstance(out, (list, tuple)) and out and all(isinstance(t, kind) for t in out):
        return list(out)
    return []


_KEPT = ("float64", "float32", "int64", "int32", "int16", "int8", "uint8", "bool")


@functools.cache
def _dtype_kept(dtype: Any) -> bool:
    return str(dtype).removeprefix("torch.") in _KEPT


def _check_dtype(t: Any, func: Any) -> None:
    if not _dtype_kept(t.dtype):
        name = str(t.dtype).removeprefix("torch.")
        raise CaptureError(f"capture cannot record {func}: its tensor is {name}, which a graph file cannot hold")


@functools.cache
def _kept_dtypes() -> frozenset[Any]:
    """The torch dtypes a graph keeps (as themselves, or int64)."""
    import torch

    return frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype) and _dtype_kept(d))


@functools.cache
def _floating_dtypes() -> frozenset[Any]:
    import torch

    return frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point)


@functools.cache
def _numpy_dtype(dtype: Any) -> np.dtype:
    import torch

    return torch.empty((), dtype=dtype).numpy().dtype


#: The dtypes a graph holds, native byte order: an array of one of them is kept as it is.
_GRAPH_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64))


def _kept(
    value: Any,
    private: set[int],
    copies: dict[tuple[Any, ...], tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]],
) -> np.ndarray:
    """A value or gradient (a tensor, or an array the capture made) as the graph keeps it: read-only,
    int64 for integer and bool tensors, in the layout it has (a transposed weight stays a transposed
    view: a graph holds any layout and saving writes C order); a copy, made in that layout (one
    pass over the memory, not a strided gather), unless it is a tensor on memory only the capture
    uses (its id in ``private``). Tensors on the same memory in another order of their axes (a
    weight and its ``t``, a gradient and its transpose) share one copy: ``copies`` holds the copies
    made so far by the memory they came from."""
    if isinstance(value, np.ndarray):
        array = value
    else:
        array = _numpy(value)
        if id(value) not in private:
            array = _copied(value, array, copies)
        elif array.dtype in _GRAPH_DTYPES:
            # the tensor's own memory, which no one else uses: read-only from now on (numpy refuses
            # to make an array over a tensor's memory writable again, so no view is needed)
            array.setflags(write=False)
            return array
    if array.dtype.kind in "biu" and array.dtype != np.int64:
        array = array.astype(np.int64)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return sealed(array)


def _copied(
    t: Any,
    array: np.ndarray,
    copies: dict[tuple[Any, ...], tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]],
) -> np.ndarray:
    """``array`` (tensor ``t``'s numbers) copied in its layout, or an earlier copy of the same
    memory seen through ``t``'s order of axes."""
    shape, strides = tuple(t.shape), tuple(t.stride())
    axes = sorted(zip(shape, strides, strict=True))
    key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(axes))
    known = copies.get(key)
    if known is None:
        copy = np.array(array, order="K")
        copies[key] = (copy, shape, strides)
        return copy
    copy, shape0, strides0 = known
    free = list(range(len(shape0)))
    order: list[int] = []
    for size, stride in zip(shape, strides, strict=True):
        at = next(i for i in free if shape0[i] == size and strides0[i] == stride)
        free.remove(at)
        order.append(at)
    return copy.transpose(order)


def _memory(t: Any) -> int:
    """Where a tensor's memory starts: the tensors on one memory share it."""
    return int(t.untyped_storage().data_ptr())


def _numpy(t: Any) -> np.ndarray:
    """A tensor's numbers as a numpy array (sharing its memory when it is on the CPU)."""
    return t.numpy(force=True)  # detach, cpu, resolve_conj, resolve_neg in one call


def _ancestors(nodes: _Nodes, outputs: list[int], cut: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The nodes ``outputs`` depend on, in order (no recursion: one sweep down the ids), not through
    the parents of the nodes in ``cut``."""
    needed = [False] * len(nodes)
    for output in outputs:
        needed[output] = True
    starts, flat = nodes.starts, nodes.flat
    end = len(flat)
    for node in range(len(nodes) - 1, -1, -1):
        start = starts[node]
        if needed[node] and node not in cut:
            for p in flat[start:end]:
                needed[p] = True
        end = start
    return [n for n in range(len(nodes)) if needed[n]]
