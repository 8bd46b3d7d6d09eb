"""The lab: the studies, their records' machinery and the commands that run them.

It lives beside the library in a clone of the repository and is not in the wheel (``pip install setpo`` installs the
library and its environments only). ``make`` puts this folder on the virtual environment's path; see
docs/getting-started.md."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
