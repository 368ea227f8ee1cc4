"""Build hook: compiles graphsvc's C extensions, one module ``graphsvc.native._cNAME`` per ``csrc/NAME.c``.

Each extension is optional. Where one cannot be built (no C compiler, no Python headers), the
install goes on with a warning and graphsvc runs the pure-Python reference of what it would have
done, with the same results, more slowly (``graphsvc --version`` says which run;
``GRAPHSVC_NATIVE=0`` turns the built ones off, the one switch of :mod:`graphsvc.native`). They are
compiled for the baseline of the machine's architecture (no ``-march=native``), so a wheel runs on
any CPU of that architecture, and with floating-point contraction off, so every operation rounds
as the reference's does.

``csrc/opmath.h``, the math of the builtin ops that ``csrc/replay.c`` compiles, is generated from
``graphsvc/ops/opmath.py`` and committed: after a change to that table, ``python -m graphsvc.ops.opmath``
writes it again (tests/ops/test_opmath.py checks that it matches, and graphsvc runs no compiled
primitive of an extension built from another table).

For development, ``python hatch_build.py [NAME...]`` rebuilds extensions into the checkout (what
an editable install does).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Compiler flags beyond the interpreter's own: no fused multiply-add, no fast-math.
EXTRA_COMPILE_ARGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-std=c11"]

ROOT = Path(__file__).resolve().parent


def extension_names(root: Path = ROOT) -> list[str]:
    return sorted(path.stem for path in (root / "csrc").glob("*.c"))


def build_extension(name: str, out_dir: Path, root: Path = ROOT) -> Path:
    """Compile ``csrc/NAME.c`` into ``out_dir/_cNAME<suffix>`` (atomically) and return its path."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    module = f"graphsvc.native._c{name}"
    extension = Extension(
        module,
        sources=[str(root / "csrc" / f"{name}.c")],
        depends=[str(root / "csrc" / header) for header in ("native.h", "opmath.h")],
        include_dirs=[str(root / "csrc")],
        extra_compile_args=EXTRA_COMPILE_ARGS,
    )
    with tempfile.TemporaryDirectory() as scratch:
        command = build_ext(Distribution({"name": "graphsvc", "ext_modules": [extension]}))
        command.build_lib = str(Path(scratch) / "lib")
        command.build_temp = str(Path(scratch) / "temp")
        command.ensure_finalized()
        command.run()
        built = Path(command.get_ext_fullpath(module))
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / built.name
        partial = out_dir / f".{built.name}.partial"
        shutil.copyfile(built, partial)
        os.replace(partial, target)  # a process importing it meanwhile sees the old file or the new one
    return target


def build_all(out_dir: Path, names: list[str] | None = None, root: Path = ROOT) -> list[Path]:
    """Build each extension that can be built; say why for each one that cannot."""
    built = []
    for name in names or extension_names(root):
        try:
            built.append(build_extension(name, out_dir, root))
        except Exception as exc:  # no compiler, no headers: that module's pure-Python reference runs
            print(
                f"graphsvc: the C extension graphsvc.native._c{name} was not built ({type(exc).__name__}: {exc}); "
                "graphsvc will run its pure-Python reference instead (slower, same results)",
                file=sys.stderr,
            )
    return built


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script, outside a build
    BuildHookInterface = object


class NativeBuildHook(BuildHookInterface):  # type: ignore[misc, valid-type]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        editable = version == "editable"
        out_dir = root / "graphsvc" / "native" if editable else Path(self.directory) / "graphsvc-native"
        built = build_all(out_dir, root=root)
        if not built:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if not editable:
            for path in built:
                build_data["force_include"][str(path)] = f"graphsvc/native/{path.name}"


if __name__ == "__main__":
    sys.exit(
        0
        if len(build_all(ROOT / "graphsvc" / "native", sys.argv[1:] or None)) == len(sys.argv[1:] or extension_names())
        else 1
    )
