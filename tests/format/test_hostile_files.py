"""Graph files from strangers: a file is data, never code; any bytes load or raise FormatError;
declared sizes are checked before allocating; limits hold at the limit and refuse one past it;
each kind of malformed structure gets a message naming where it is.

(tests/format/test_format.py holds the first table of bad inputs with exact messages; this module adds
what hostile input needs on top of it.)
"""

from __future__ import annotations

import ast
import builtins
import importlib
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli import app
from fuzz.property import check_input
from graphsvc import format as fmt
from graphsvc.errors import FormatError, GraphsvcError, OpError
from graphsvc.format import jsonio
from graphsvc.graph import GraphBuilder, OpSource
from graphsvc.pluginhost import load_registry
from graphsvc.replay import columns as replay
from graphsvc.topo import reverse_topological_order
from tests.conftest import ROOT

SAMPLE_FILES = sorted((ROOT / "schemas" / "examples").glob("*.msgpack")) + sorted((ROOT / "examples").glob("*.msgpack"))
SAMPLES = [path.read_bytes() for path in SAMPLE_FILES]
REGISTRY, _ = load_registry(disable_third_party=True)
runner = CliRunner()


def worked() -> dict[str, Any]:
    """The worked example of FORMAT.md as a decoded document: y = a * 3 at a = 2."""
    return msgpack.unpackb((ROOT / "schemas" / "examples" / "worked.msgpack").read_bytes())


def packed(document: Any) -> bytes:
    return msgpack.packb(document, use_bin_type=True)


def message(data: bytes, limits: fmt.Limits = fmt.DEFAULT_LIMITS) -> str:
    with pytest.raises(FormatError) as info:
        fmt.loads(data, limits)
    return str(info.value)


# -- 1. a file is data -----------------------------------------------------------------------------
PAYLOAD = "graphsvc_hostile_payload"


@pytest.mark.usefixtures("no_installed_plugins")
def test_nothing_named_in_a_file_is_ever_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Op tags, plugin names, names, attributes and metadata that name a module are only data: loading,
    converting, ordering and replaying the file (in Python and through the CLI) imports none of them."""
    marker = tmp_path / "imported"
    (tmp_path / f"{PAYLOAD}.py").write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    b = GraphBuilder()
    x = b.leaf(1.0, name=PAYLOAD)
    y = b.add(PAYLOAD, [x], name="os.system", attrs={"module": PAYLOAD, "callable": f"{PAYLOAD}:run"})
    b.add(f"__import__('{PAYLOAD}')", [y], attrs={"pickle": "cos\nsystem\n(S'true'\ntR."})
    b.op_sources[PAYLOAD] = OpSource(PAYLOAD, "6.6.6")
    path = tmp_path / "hostile.msgpack"
    fmt.save(b.build(metadata={"plugin": PAYLOAD, "entry_point": f"{PAYLOAD}:hook"}), path)

    imported: list[str] = []
    real_import, real_import_module = builtins.__import__, importlib.import_module

    def recording_import(name: str, *args: Any, **kwargs: Any) -> Any:
        imported.append(name)
        return real_import(name, *args, **kwargs)

    def recording_import_module(name: str, package: str | None = None) -> Any:
        imported.append(name)
        return real_import_module(name, package)

    monkeypatch.setattr(builtins, "__import__", recording_import)
    monkeypatch.setattr(importlib, "import_module", recording_import_module)

    graph = fmt.load(path)
    jsonio.loads(jsonio.dumps(graph))
    reverse_topological_order(graph, None, "kahn")
    with pytest.raises(
        OpError, match=rf"^the graph uses ops not registered here: {PAYLOAD} \(from {PAYLOAD} 6\.6\.6\)"
    ):
        replay.forward(graph, REGISTRY)
    for command in (["inspect", "--json"], ["order"], ["validate"], ["backward"], ["convert", "--to", "json"]):
        result = runner.invoke(app, [*command[:1], str(path), *command[1:]])
        # validate checks the ops too, as backward does before it runs: neither imports any
        assert result.exit_code == (4 if command in (["backward"], ["validate"]) else 0), result.output

    assert imported, "the recording hooks saw no import at all: the test is not watching"
    assert [name for name in imported if PAYLOAD in name or "pickle" in name] == []
    assert not marker.exists()
    assert PAYLOAD not in sys.modules


#: Calls and imports that would run code from data. Plugins are imported by module name or file, but
#: only names the user gives (--plugin, GRAPHSVC_PLUGINS, entry points), never names from a file.
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
IMPORTING_CALLS = {"import_module", "spec_from_file_location", "exec_module"}
#: pluginhost/__init__.py imports the plugins the user names; __init__.py imports its own submodules
#: lazily from a fixed table (the public API); native/loader.py imports graphsvc's own C extensions,
#: by the fixed names of native.EXTENSIONS.
IMPORTERS = {"pluginhost/__init__.py", "__init__.py", "native/loader.py"}
#: The plugin host runs a plugin file the user names from the bytes of the regular file it opened
#: (``exec(compile(...))``), not from a second look at the path; no other module may.
PLUGIN_RUNNER = "pluginhost/__init__.py"


def test_no_pickle_eval_or_exec_anywhere_in_graphsvc() -> None:
    problems = []
    for path in [*sorted((ROOT / "graphsvc").rglob("*.py")), ROOT / "cli.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = path.relative_to(ROOT / "graphsvc").as_posix() if path.parent != ROOT else path.name
        for node in ast.walk(tree):
            where = f"{module}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                problems += [
                    f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                problems.append(f"{where} imports from {node.module}")
            elif isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                runs_a_plugin = module == PLUGIN_RUNNER and name in ("exec", "compile")
                if isinstance(node.func, ast.Name) and name in FORBIDDEN_CALLS and not runs_a_plugin:
                    problems.append(f"{where} calls {name}()")
                if name in IMPORTING_CALLS and module not in IMPORTERS:
                    problems.append(f"{where} calls {name}() outside {', '.join(sorted(IMPORTERS))}")
    assert problems == []


# -- 2. any bytes: a graph or FormatError ------------------------------------------------------------
def _survives(data: bytes) -> None:
    """Only a one-line FormatError may escape loads(); a graph that loads survives what the CLI does."""
    check_input(data, REGISTRY)


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.binary(max_size=600))
def test_random_bytes_load_or_raise_format_error(data: bytes) -> None:
    _survives(data)


@FAST
@given(st.sampled_from(SAMPLES), st.data())
def test_random_bytes_after_a_valid_prefix(sample: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(sample)))
    _survives(sample[:cut] + data.draw(st.binary(max_size=64)))


DTYPES = [b"<f8", b"<f4", b">f8", b"<i8", b"<i4", b"<u2", b">u2", b"|u1", b"<c8", b"<U1", b"|O8"]
LENGTH_VALUES = [0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1, -1, -(2**31)]


@st.composite
def mutations(draw: st.DrawFn) -> bytes:
    """A valid file with a few byte-level edits: bit flips, overwritten bytes, truncations, splices
    from another file, deleted or repeated ranges, msgpack lengths rewritten, dtypes swapped."""
    data = bytearray(draw(st.sampled_from(SAMPLES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "truncate", "splice", "delete", "repeat", "length", "dtype"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            other = draw(st.sampled_from(SAMPLES))
            start = draw(st.integers(0, len(other)))
            data[at:] = other[start:]
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 16))]
        elif kind == "length":
            # rewrite the integer after a "length" or "count" key, or a bin/str/array header
            spots = [i for key in (b"\xa6length", b"\xa5count") for i in _find_all(data, key)]
            spots += [i for i, byte in enumerate(data) if byte in (0xC4, 0xC5, 0xC6, 0xD9, 0xDC, 0xDD, 0xDE)]
            if spots:
                spot = draw(st.sampled_from(spots))
                key_length = 7 if data[spot : spot + 7] == b"\xa6length" else 6 if data[spot] == 0xA5 else 0
                end = spot + key_length
                data[end : end + 1] = (
                    packed(draw(st.sampled_from(LENGTH_VALUES))) if key_length else data[end : end + 1]
                )
                if not key_length:
                    width = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDC: 2, 0xDD: 4, 0xDE: 2}[data[spot]]
                    value = draw(st.integers(0, 256**width - 1))
                    data[spot + 1 : spot + 1 + width] = value.to_bytes(width, "big")
        elif kind == "dtype":
            spots = [i for old in DTYPES[:1] + DTYPES[4:7] + [b"<i8"] for i in _find_all(data, old)]
            if spots:
                spot = draw(st.sampled_from(spots))
                data[spot : spot + 3] = draw(st.sampled_from(DTYPES))
    return bytes(data)


def _find_all(data: bytearray, needle: bytes) -> list[int]:
    found, start = [], data.find(needle)
    while start >= 0:
        found.append(start)
        start = data.find(needle, start + 1)
    return found


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_mutated_files_load_or_raise_format_error(data: bytes) -> None:
    _survives(data)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=24),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES), st.data())
def test_documents_with_a_field_replaced_load_or_raise_format_error(sample: bytes, data: st.DataObject) -> None:
    """Structure-aware mutation: decode, replace a value anywhere (a count, a dtype, a column, a
    name, an index) with any msgpack value, encode again."""
    document = msgpack.unpackb(sample)
    for _ in range(data.draw(st.integers(1, 3))):
        holder: Any = document
        while True:
            keys = list(holder) if isinstance(holder, dict) else list(range(len(holder)))
            if not keys:
                break
            key = data.draw(st.sampled_from(keys))
            if isinstance(holder[key], (dict, list)) and holder[key] and data.draw(st.booleans()):
                holder = holder[key]
                continue
            holder[key] = data.draw(msgpack_values)
            break
    _survives(packed(document))


# -- 3. truncation and trailing bytes ---------------------------------------------------------------
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[str(p.relative_to(ROOT)) for p in SAMPLE_FILES])
def test_every_prefix_says_truncated_and_any_trailing_byte_is_refused(path: Path) -> None:
    data = path.read_bytes()
    for end in range(len(data)):
        assert message(data[:end]).startswith("the file is truncated: "), end
    for extra in (b"\x00", b"\xc0", b"\x90", b"\x80", b"\xa1x", data):
        follow = "1 byte follows" if len(extra) == 1 else f"{len(extra)} bytes follow"
        assert message(data + extra) == f"trailing bytes after the document: {follow} the first {len(data)}"


# -- 4. sizes are checked before anything is allocated ------------------------------------------------
def _claims_a_billion_nodes(d: dict[str, Any]) -> None:
    d["nodes"]["count"] = 10**9
    for column in ("op_codes", "parent_offsets", "parent_indices", "values"):
        d["nodes"][column]["length"] = 10**9 + (column == "parent_offsets")


HUGE_CLAIMS: list[tuple[str, Callable[[], bytes], str]] = [
    (
        "a billion nodes in the columns' lengths",
        lambda: packed(_mutate(worked(), _claims_a_billion_nodes)),
        "nodes.op_codes.data holds 6 bytes, but 1000000000 x <u2 needs 2000000000",
    ),
    (
        "a 4 GiB bin header on the values",
        lambda: _replace(packed(worked()), b"\xa4data\xc4\x18", b"\xa4data\xc6\xff\xff\xff\xff"),
        "the file is truncated: 393 bytes end in the middle of the document",
    ),
    (
        "a billion names",
        lambda: _replace(packed(worked()), b"\xa5names\x92", b"\xa5names\xdd\x3b\x9a\xca\x00"),
        "the file is truncated: an array declares 1000000000 entries, more than the file's 394 bytes can hold",
    ),
    (
        "a map of four billion metadata entries",
        lambda: _replace(packed(worked()), b"\xa8metadata\x80", b"\xa8metadata\xdf\xff\xff\xff\xff"),
        "the file is truncated: a map declares 4294967295 entries, more than the file's 394 bytes can hold",
    ),
    (
        "a 2 GiB string",
        lambda: _replace(packed(worked()), b"\xa1y", b"\xdb\x7f\xff\xff\xffy"),
        "the file is truncated: 394 bytes end in the middle of the document",
    ),
]


def _mutate(document: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    change(document)
    return document


def _replace(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, old
    return data.replace(old, new)


@pytest.mark.parametrize(("build", "expected"), [c[1:] for c in HUGE_CLAIMS], ids=[c[0] for c in HUGE_CLAIMS])
def test_a_small_file_claiming_huge_sizes_fails_at_once_using_little_memory(
    build: Callable[[], bytes], expected: str
) -> None:
    data = build()
    assert len(data) < 500
    tracemalloc.start()
    started = time.perf_counter()
    try:
        text = message(data)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text == expected
    assert peak < 256 * 1024, f"{peak} bytes allocated"
    assert elapsed < 0.5


def _names(count: int, length: int) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.__setitem__("names", [[0, "a" * length]][:count])


def _attr_depth(levels: int) -> Callable[[dict[str, Any]], None]:
    """Node 2's attributes reach ``levels``: {"k": [[...[1]...]]} with levels - 1 arrays."""

    def change(d: dict[str, Any]) -> None:
        value: Any = 1
        for _ in range(levels - 1):
            value = [value]
        d["attrs"] = [[2, {"k": value}]]

    return change


def _metadata_depth(levels: int) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        value: Any = "deep"
        for _ in range(levels - 1):
            value = {"k": value}
        d["metadata"] = {"k": value}

    return change


def test_node_and_edge_limits_admit_a_file_at_the_limit_and_refuse_one_past_it() -> None:
    data = packed(worked())  # 3 nodes, 2 edges
    assert fmt.loads(data, fmt.Limits(max_nodes=3, max_edges=2)).num_nodes == 3
    assert message(data, fmt.Limits(max_nodes=2)) == "nodes.count is 3, outside the limit 0..2"
    assert message(data, fmt.Limits(max_edges=1)) == "nodes.parent_indices has 2 entries, over the limit 1"


#: (a document change of size n, the limits, n at the limit, the message at n + 1)
LIMITS: list[tuple[str, Callable[[int], Callable[[dict[str, Any]], None]], fmt.Limits, int, str]] = [
    (
        "max_string_length",
        lambda n: _names(1, n),
        fmt.Limits(max_string_length=40),
        40,
        "a string of 41 bytes is longer than the limit of 40 bytes",
    ),
    (
        "max_attr_depth",
        _attr_depth,
        fmt.Limits(max_attr_depth=5),
        5,
        "the attribute map of node 2 nests deeper than 5 levels",
    ),
    ("metadata depth", _metadata_depth, fmt.Limits(max_attr_depth=5), 5, "metadata nests deeper than 5 levels"),
    (
        "one level",
        _attr_depth,
        fmt.Limits(max_attr_depth=1),
        1,
        "the attribute map of node 2 nests deeper than 1 level",
    ),
    (
        "default max_attr_depth",
        _attr_depth,
        fmt.DEFAULT_LIMITS,
        32,
        "the attribute map of node 2 nests deeper than 32 levels",
    ),
]


@pytest.mark.parametrize(("change", "limits", "at", "past"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_each_limit_admits_a_file_at_the_limit_and_refuses_one_past_it(
    change: Callable[[int], Callable[[dict[str, Any]], None]], limits: fmt.Limits, at: int, past: str
) -> None:
    assert fmt.loads(packed(_mutate(worked(), change(at))), limits).num_nodes == 3
    assert message(packed(_mutate(worked(), change(at + 1))), limits) == past


def test_a_huge_graph_is_refused_by_max_nodes_before_its_columns_are_read() -> None:
    b = GraphBuilder()
    b.leaf()
    for i in range(1, 20_000):
        b.add("neg", [i - 1])
    data = fmt.dumps(b.build())
    assert message(data, fmt.Limits(max_nodes=10_000)) == "nodes.count is 20000, outside the limit 0..10000"


# -- 5. each malformed structure names where it is ---------------------------------------------------
def _with_placeholder(change: Callable[[dict[str, Any]], None], old: bytes, new: bytes) -> Callable[[], bytes]:
    """Encode the changed document, then swap placeholder bytes for what msgpack will not write
    (a repeated key, a non-string key, invalid UTF-8)."""
    return lambda: _replace(packed(_mutate(worked(), change)), old, new)


def _set(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        holder = d
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value

    return change


def _columns(**data: bytes) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        for key, payload in data.items():
            d["nodes"][key]["data"] = payload
            d["nodes"][key]["length"] = len(payload) // fmt.COLUMN_DTYPES[key].itemsize

    return change


TOPO = "node ids must be in topological order (every parent id smaller than its child's)"

WHERE: list[tuple[str, Callable[[], bytes], str]] = [
    (
        "repeated key in a nested metadata map",
        _with_placeholder(_set("metadata", value={"run": {"seed": 1, "seeX": 2}}), b"\xa4seeX", b"\xa4seed"),
        "the map at metadata.run repeats the key 'seed'",
    ),
    (
        "repeated key in an op entry",
        _with_placeholder(
            lambda d: None,
            b"\xa6plugin\xc0\xa7version\xc0\x83\xa3tag\xa5const",
            b"\xa6plugin\xc0\xa3tag\xc0\x83\xa3tag\xa5const",
        ),
        "the map at ops[0] repeats the key 'tag'",
    ),
    (
        "repeated key in a column",
        _with_placeholder(lambda d: None, b"\xa6length\x03\xa4data\xc4\x18", b"\xa6length\x03\xa6length\xc4\x18"),
        "the map at nodes.values repeats the key 'length'",
    ),
    (
        "integer key in an attribute map",
        _with_placeholder(_set("attrs", value=[[2, {"K": 1.5}]]), b"\xa1K", b"\x07"),
        "the map at attrs[0][1] has a key that is not a string (an integer, entry 0)",
    ),
    (
        "bin key in the nodes map",
        _with_placeholder(lambda d: None, b"\xa5count", b"\xc4\x05count"),
        "the map at nodes has a key that is not a string (bin data, entry 0)",
    ),
    (
        "invalid UTF-8 in a name",
        _with_placeholder(lambda d: None, b"\xa1y", b"\xa1\xff"),
        "the string at names[1][1] is not valid UTF-8",
    ),
    (
        "invalid UTF-8 in an op tag",
        _with_placeholder(lambda d: None, b"\xa3mul", b"\xa3m\xc3\x28"),
        "the string at ops[2].tag is not valid UTF-8",
    ),
    (
        "invalid UTF-8 under a key that is not an identifier",
        _with_placeholder(_set("metadata", value={"run notes": ["ok", "@@"]}), b"\xa2@@", b"\xa2\xed\xa0"),
        "the string at metadata['run notes'][1] is not valid UTF-8",
    ),
    (
        "invalid UTF-8 in a metadata key",
        _with_placeholder(_set("metadata", value={"@@": 1}), b"\xa2@@", b"\xa2\xc0\x80"),
        "the map at metadata has a key that is not valid UTF-8 (entry 0)",
    ),
    (
        "wrong dtype of the parent indices",
        lambda: packed(_mutate(worked(), _set("nodes", "parent_indices", "dtype", value="<i8"))),
        "nodes.parent_indices.dtype is '<i8', but version 1 requires '<i4'",
    ),
    (
        "dtype that is not a string",
        lambda: packed(_mutate(worked(), _set("nodes", "values", "dtype", value=8))),
        "nodes.values.dtype must be a string, not an integer",
    ),
    (
        "negative node id in names",
        lambda: packed(_mutate(worked(), _set("names", value=[[-1, "a"]]))),
        "names[0] refers to node -1, which does not exist (the graph has 3 nodes)",
    ),
    (
        "out-of-range node id in attrs",
        lambda: packed(_mutate(worked(), _set("attrs", value=[[3, {}]]))),
        "attrs[0] refers to node 3, which does not exist (the graph has 3 nodes)",
    ),
    (
        "negative output",
        lambda: packed(_mutate(worked(), _set("outputs", value=[-1]))),
        "output -1 does not exist (the graph has 3 nodes)",
    ),
    (
        "offsets ending past the parent indices",
        lambda: packed(_mutate(worked(), _columns(parent_offsets=struct.pack("<4q", 0, 0, 0, 3)))),
        "parent_offsets ends at 3 but there are 2 parent indices",
    ),
    (
        "offsets whose difference overflows int64",  # found by fuzz/fuzz_loads.py
        lambda: packed(_mutate(worked(), _columns(parent_offsets=struct.pack("<4q", 0, 2**62 + 2**61, -(2**62), 2)))),
        "parent_offsets decreases at node 1",
    ),
    (
        "offsets that go back",
        lambda: packed(_mutate(worked(), _columns(parent_offsets=struct.pack("<4q", 0, 2, 0, 2)))),
        "parent_offsets decreases at node 1",
    ),
    (
        "a two-node cycle",
        lambda: packed(
            _mutate(
                worked(),
                _columns(
                    op_codes=struct.pack("<3H", 0, 2, 2),
                    parent_offsets=struct.pack("<4q", 0, 0, 2, 4),
                    parent_indices=struct.pack("<4i", 0, 2, 0, 1),
                ),
            )
        ),
        f"node 1 has parent 2, which does not come before it: {TOPO}",
    ),
]


@pytest.mark.parametrize(("build", "expected"), [c[1:] for c in WHERE], ids=[c[0] for c in WHERE])
def test_each_malformed_structure_names_where_it_is(build: Callable[[], bytes], expected: str) -> None:
    assert message(build()) == expected


def test_a_cycle_cannot_enter_through_the_json_form() -> None:
    text = jsonio.dumps(fmt.loads((ROOT / "schemas" / "examples" / "worked.msgpack").read_bytes()))
    cyclic = text.replace('"parents": []', '"parents": [2]', 1)
    assert cyclic != text
    with pytest.raises(GraphsvcError, match=r"cycle"):
        jsonio.loads(cyclic)
