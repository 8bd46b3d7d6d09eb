"""``setpo``, the installed command: the library's own commands, each the same as its ``python -m`` form.

    setpo verl ...        python -m setpo.verl        a SetPO run on verl (scripts/run_setpo.sh runs this)
    setpo judge ...       python -m setpo.judge       the LLM-judged diversity of rollout sets
    setpo models ...      python -m setpo.models      packaged real models as ordinary model folders, offline
    setpo math-data ...   python -m setpo.envs.math   math data sets as verl parquet files

The studies, figures and benchmarks are the lab's, which lives in a clone of the repository and not in the wheel:
``make demo``, ``make figures``, ``make bench`` (or ``python -m setpo_lab.cli ...`` from the clone).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence


def _verl(argv):
    from setpo.verl.launch import cli
    return cli(argv)


def _judge(argv):
    from setpo.judge.__main__ import main
    return main(argv)


def _models(argv):
    from setpo.models.__main__ import main
    return main(argv)


def _math_data(argv):
    from setpo.envs.math import main
    main(argv)  # exits 2 itself on bad input
    return 0


# Each command is imported only when chosen: `setpo judge` never loads verl or ray.
COMMANDS: dict[str, Callable[[list[str]], int | None]] = {
    "verl": _verl, "judge": _judge, "models": _models, "math-data": _math_data}
LAB_COMMANDS = ("demo", "sweep", "figures", "bench", "countdown")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: setpo {{{','.join(COMMANDS)}}} ..."
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n\n" + __doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in COMMANDS:
        return COMMANDS[cmd](rest) or 0
    if cmd in LAB_COMMANDS:
        print(f"setpo: error: {cmd} is a lab command, not in the installed package: from a clone of the repository, "
              f"`make {cmd}` or `python -m setpo_lab.cli {cmd}`", file=sys.stderr)
    else:
        print(f"setpo: error: unknown command {cmd!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
