"""Command-line interface: ``kvsim COMMAND ...`` or ``python -m kvsim COMMAND ...``.

Each command lives in its own module with a ``register(subparsers)`` function that adds
its parser and sets ``func``; ``COMMANDS`` lists them in help order. Every command takes
``--json``. A caller's mistake prints one line ``kvsim: error: ...`` and exits 2; no
traceback reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvsim import __version__
from kvsim.errors import KvsimError

#: Modules under kvsim.cli, one per command, in the order `kvsim --help` lists them.
COMMANDS = ("models", "calc", "capacity", "cost", "simulate", "live", "engine")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other error
        self.exit(2, f"kvsim: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsim", description="KV-cache calculator, simulator and live measurements.")
    parser.add_argument("--version", action="version", version=f"kvsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"kvsim.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"kvsim.cli.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KvsimError as exc:
        print(f"kvsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
