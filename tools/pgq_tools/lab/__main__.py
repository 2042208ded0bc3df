"""python -m pgq_tools.lab --out DIR [--dsn DSN]: run the acceptance lab (same as pgq-thin lab)."""

from __future__ import annotations

import argparse
import logging
import sys

from pgq_tools.lab import run_lab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgq_tools.lab", description=__doc__)
    parser.add_argument("--out", required=True, help="the evidence directory to write")
    parser.add_argument("--dsn", default=None,
                        help="a server to run on (the lab creates and drops its own databases there); "
                             "default: a throwaway PostgreSQL started for the run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("pgq_tools.lab").setLevel(logging.INFO)
    return run_lab(args.out, args.dsn)


if __name__ == "__main__":
    sys.exit(main())
