"""The ``ablate`` command. It only parses, calls and prints; the logic lives in importable functions.

Heavy libraries (torch, lightning, ray, mlflow) are imported inside the commands, so ``ablate --help``
answers at once.
"""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from ablations.demo import demo

    demo(steps=args.steps)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ablate", description="Ablation studies of Transformers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("demo", help="train a few model variants for a few steps on random copy data (a smoke test)")
    p.add_argument("--steps", type=int, default=30, help="optimisation steps per variant (default 30)")
    p.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
