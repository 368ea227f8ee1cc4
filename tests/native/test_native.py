"""graphsvc's C extensions: built by the install (hatch_build.py), or their absence said plainly."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tests.conftest import ROOT, native_missing, require_native

NAMES = sorted(path.stem for path in (ROOT / "csrc").glob("*.c"))


def test_every_c_source_is_an_extension_that_was_built() -> None:
    """Each csrc/NAME.c is the module graphsvc.native._cNAME. Where one was not built (no C compiler at
    install), graphsvc runs its pure-Python references and this test skips, except with
    GRAPHSVC_REQUIRE_NATIVE=1 (as .ci/run sets it), where it fails."""
    assert NAMES == ["json", "memory", "replay", "table", "text", "topo", "walk"]
    from graphsvc import native  # native.built(), which graphsvc --version reports, looks for these

    assert list(native.EXTENSIONS) == NAMES
    missing = []
    for name in NAMES:
        try:
            importlib.import_module(f"graphsvc.native._c{name}")
        except ImportError as exc:
            missing.append(f"graphsvc.native._c{name} ({exc})")
    if not missing:
        return
    native_missing(
        f"not built: {', '.join(missing)}; pip builds them at install with a C compiler and Python's headers"
        " (apt-get install gcc python3-dev), then reinstall"
    )


def test_a_buffer_of_the_wrong_item_size_is_refused() -> None:
    _ctopo = require_native("topo")
    offsets = np.array([0, 0], dtype=np.int32)  # offsets are int64
    with pytest.raises(TypeError, match=r"^offsets: items of 4 bytes, not 8$"):
        _ctopo.levels(offsets, np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64))
    with pytest.raises(TypeError, match=r"^offsets: items of 1 byte, not 8$"):  # one, as text.counted words it
        _ctopo.levels(offsets.astype(np.uint8), np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64))
    readonly = np.zeros(1, dtype=np.int64)
    readonly.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):  # a result must be writable
        _ctopo.levels(np.array([0, 0], dtype=np.int64), np.zeros(0, dtype=np.int32), readonly)
