"""The version moves with the CHANGELOG (CHANGELOG.md's rule): its newest entry names the version that
pyproject.toml and ``setpo.__version__`` carry, and entries are dated, newest first."""

import re
import tomllib
from datetime import date
from pathlib import Path

import setpo

ROOT = Path(__file__).resolve().parents[1]


def test_the_newest_changelog_entry_is_the_packages_version():
    headings = re.findall(r"^## (\S+)(?: \((\d{4}-\d{2}-\d{2})\))?$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    versions = [v for v, _ in headings if v != "Unreleased"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert versions[0] == pyproject == setpo.__version__
    released = [(tuple(map(int, v.split("."))), date.fromisoformat(d)) for v, d in headings if v != "Unreleased"]
    assert all(d for _, d in released), "every released entry is dated"
    assert released == sorted(released, reverse=True), "newest first, versions and dates both"
