"""``python -m setpo.verl``: the launcher (``setpo.verl.launch.main``)."""

import sys

from setpo.verl.launch import main

sys.exit(main())
