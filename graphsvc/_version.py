"""graphsvc's version, the one ``pyproject.toml`` gives: here, in the base layer, so that any module
(the plugin host records it on the builtin ops) reads it without importing the package's top;
:mod:`graphsvc` re-exports it as ``graphsvc.__version__``."""

__version__ = "0.1.0"
