"""``python -m setpo_lab ...``: the lab's commands (``setpo_lab.cli``), e.g. ``python -m setpo_lab run countdown --smoke``."""

import sys

from setpo_lab.cli import main

sys.exit(main())
