"""Write a venv's installed versions as a pip constraints file: `python scripts/freeze_constraints.py VENV OUT`.

`make test-newest` calls it after the suite passed at the newest releases, so that `make demo` and `make test`
install what was tested (the Makefile's CONSTRAINTS). Left out: this project itself (editable), torch (the
Makefile installs TORCH_SPEC first, from TORCH_INDEX if set: a constraint would fight a user's chosen build) and
anything installed from a URL or a local path rather than an index.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path

#: never constrained: the project (installed editable) and the torch build TORCH_SPEC chooses
SKIP = {"setpo", "torch"}


def pins(freeze_lines: list[str]) -> list[str]:
    """The ``name==version`` lines of ``pip freeze`` output, names lower-cased with ``_`` as ``-``, sorted; SKIP,
    editable, URL and local installs dropped."""
    out = {}
    for line in freeze_lines:
        line = line.strip()
        if not line or line.startswith(("#", "-")) or " @ " in line or "==" not in line:
            continue
        name, version = line.split("==", 1)
        name = name.strip().lower().replace("_", "-")
        if name not in SKIP:
            out[name] = version.strip()
    return [f"{name}=={out[name]}" for name in sorted(out)]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python scripts/freeze_constraints.py VENV OUT", file=sys.stderr)
        return 2
    venv, out = Path(argv[0]), Path(argv[1])
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"{python}: no such interpreter; build the venv first (make test-newest does)", file=sys.stderr)
        return 2
    freeze = subprocess.run([str(python), "-m", "pip", "freeze", "--disable-pip-version-check"], check=True,
                            capture_output=True, text=True).stdout.splitlines()
    version = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=True,
                             capture_output=True, text=True).stdout.strip()
    header = [f"# The versions the whole suite last passed at (`make test-newest`, {date.today().isoformat()}, Python "
              f"{version}, {venv.name}).",
              "# `make demo` and `make test` install under these constraints; torch comes from TORCH_SPEC. Do not edit",
              "# by hand: `make test-newest` rewrites this file when the suite passes at the newest releases."]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header + pins(freeze)) + "\n")
    print(f"wrote {out} ({len(pins(freeze))} pins)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
