"""`vlmgym tracking sync`: send the MLflow logs that stages could not send (their server was down as they ended)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vlmgym.tracking import spool
from vlmgym.tracking.stage_runs import store_root


def sync(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vlmgym tracking sync", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None,
                        help=f"the folder holding {spool.SPOOL_DIR}/ (default: the repository's, beside mlflow.db)")
    args = parser.parse_args(argv)
    root = Path(args.root) if args.root else store_root()
    done, left = spool.sync(root)
    if not done and not left:
        print(f"vlmgym tracking sync: nothing to send ({spool.spool_root(root)} holds no logs)")
        return 0
    print(f"vlmgym tracking sync: {done} run logs sent" + (f", {left} left (server down, or in use by a "
                                                           "running stage)" if left else ""))
    return 1 if left else 0


COMMANDS = {"sync": ("vlmgym.cli.tracking:sync", "send the logs stages kept in mlflow-spool/ to their MLflow server")}


def main(argv: list[str]) -> int:
    from vlmgym.cli import dispatch

    return dispatch("vlmgym tracking", COMMANDS, argv)
