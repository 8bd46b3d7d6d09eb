"""``python -m setpo.verl``: the launcher (``setpo.verl.launch.cli``: errors as one line, exit status 2)."""

import sys

from setpo.verl.launch import cli

sys.exit(cli())
