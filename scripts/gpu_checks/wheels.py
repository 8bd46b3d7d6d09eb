"""The wheel folder: everything the check needs beyond a bare CUDA machine's packages, gathered beforehand
(``prepare``, on a machine with internet) and installed offline (``install``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MAX_WHEELS_MB = 60

#: What the check needs beyond the bare machine's packages, pinned to the versions the project tests with.
#: Downloaded with --no-deps: exactly these files, nothing they would pull in (verl's Ray, vLLM, ...).
WHEELS = {
    "trl==1.16.0": "SetPOTrainer's base (GRPOTrainer)",
    "datasets==5.2.0": "TRL's datasets",
    "dill==0.4.1": "datasets",
    "multiprocess==0.70.19": "datasets",
    "xxhash==4.1.0": "datasets",
    "gymnasium==1.4.0": "setpo.envs (imported by the reward functions' package)",
    "cloudpickle==3.1.3": "gymnasium",
    "farama-notifications==0.0.6": "gymnasium",
    "math-verify==0.9.0": "the math reward",
    "latex2sympy2_extended==1.11.0": "math-verify",
    "omegaconf==2.3.1": "verl's config objects",
    "verl==0.9.1": "verl's core_algos registry (its Ray-based trainer is not run)",
    "codetiming==1.4.0": "verl",
    "tensordict==0.10.0": "verl",
    "pyvers==0.1.0": "tensordict",
    "orjson==3.13.0": "tensordict",
}
#: Only published as a source archive: built into a (pure-Python) wheel by ``prepare``.
SDIST_WHEELS = {"antlr4-python3-runtime==4.9.3": "omegaconf and math-verify's LaTeX parser"}
#: The bare machine's packages (``install`` checks they are there; it never installs them).
BASE_PACKAGES = ("torch", "transformers", "sentence_transformers", "accelerate", "pandas", "pyarrow")

#: The GPU machine's Python is not known in advance: compiled wheels are fetched for each of these.
PYTHON_VERSIONS = ("3.11", "3.12")  # TRL 1.16 needs >= 3.11, verl 0.9.1 < 3.13


def prepare(wheels: Path, python_versions=PYTHON_VERSIONS, platform_tag: str | None = None) -> int:
    """Download (pip download --no-deps) every wheel the check needs into ``wheels``, for each Python version
    (compiled wheels differ by version; pure ones are shared), build the sdist-only ones, check the size."""
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    for version in python_versions:
        target = ["--python-version", version, "--implementation", "cp",
                  *(["--platform", platform_tag] if platform_tag else [])]
        cmd = [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *target, *WHEELS]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            return 1
    cmd = [*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), *SDIST_WHEELS]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode:
        return 1
    files = sorted(wheels.glob("*.whl"))
    total = sum(f.stat().st_size for f in files)
    manifest = {"python_versions": list(python_versions), "files": {f.name: f.stat().st_size for f in files},
                "total_mb": round(total / 2**20, 2), "why": {**WHEELS, **SDIST_WHEELS}}
    (wheels / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(files)} wheels, {total / 2**20:.1f} MB in {wheels} (limit {MAX_WHEELS_MB} MB)")
    if total > MAX_WHEELS_MB * 2**20:
        print(f"the wheel folder is over {MAX_WHEELS_MB} MB", file=sys.stderr)
        return 1
    return 0


def install(wheels: Path) -> int:
    """pip install --no-index --no-deps the pinned packages from ``wheels`` (pip picks the wheel that fits
    this Python), after checking that the base packages are there."""
    import importlib.util

    missing = [p for p in BASE_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        print(f"missing base packages (install them first): {', '.join(missing)}", file=sys.stderr)
        return 2
    if not any(wheels.glob("*.whl")):
        print(f"no wheels in {wheels}; run `python scripts/gpu_check.py prepare --wheels {wheels}` on a machine "
              "with internet first", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index",
           "--find-links", str(wheels), "--no-deps", *WHEELS, *SDIST_WHEELS]
    print("+", " ".join(cmd[:9]), f"... ({len(WHEELS) + len(SDIST_WHEELS)} packages)", flush=True)
    return subprocess.run(cmd).returncode

