"""``python -m graphsvc`` and the ``graphsvc`` console command."""

from __future__ import annotations


def main() -> None:
    try:
        # Installed from a wheel: the checkout's top-level cli.py ships inside the package.
        from graphsvc.cli import run
    except ModuleNotFoundError as exc:
        if exc.name != "graphsvc.cli":
            raise
        # A checkout or an editable install: cli.py sits next to the graphsvc folder.
        from cli import run
    run()


if __name__ == "__main__":
    main()
