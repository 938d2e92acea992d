"""Command line: `python -m via_sd generate | bench | route | profile | setup`."""

from __future__ import annotations

import argparse
import sys

from . import bench, generate, profile, route, setup


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m via_sd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (generate, setup, bench, route, profile):
        command.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
        return 130
