"""``python -m setpo.models prepare NAME DIR`` (an ordinary model folder from a packaged model, see
``setpo.models``) and ``python -m setpo.models list``. A missing package or a bad file is one line on stderr
that says what to do, exit status 2."""

from __future__ import annotations

import argparse
import sys

from setpo.models import DEFAULT_MODEL, PACKAGED_MODELS, prepare_model

PROG = "python -m setpo.models"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="Real language models from packages, offline.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="write an ordinary transformers model folder of a packaged model")
    pr.add_argument("name", choices=sorted(PACKAGED_MODELS), help=f"the model (e.g. {DEFAULT_MODEL})")
    pr.add_argument("out_dir", help="the folder to write (reused when already prepared)")
    pr.add_argument("--force", action="store_true", help="rewrite the folder even when it is prepared")
    sub.add_parser("list", help="the packaged models and the package each comes from")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for m in PACKAGED_MODELS.values():
            print(f"{m.name}: {m.distribution}=={m.version} ({m.license}) {m.file}")
        return 0
    try:
        prepare_model(args.out_dir, args.name, force=args.force)
    except (FileNotFoundError, ValueError) as err:
        print(f"{PROG}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
