"""What a newcomer to the lab has to learn, measured from the syntax tree (formatting cannot move these numbers).

    python scripts/lab_concepts.py            # the table
    python scripts/lab_concepts.py --json     # the same, machine-readable

- study-specific names: public (no leading underscore) functions and classes defined at the top level of a module
  in ``setpo_lab/studies`` whose name starts with a study's name (countdown, math, short_answers, rubric, toy);
- names defined in two or more study modules: the same public name defined by modules of different studies, or
  by two modules of one study;
- statements: every statement in ``setpo_lab`` (all of it), docstrings not counted;
- the longest module in ``setpo_lab`` and ``setpo``, in lines.

Issue 58's targets: study-specific names <= 110, names in two or more study modules <= 3, statements <= 4,000, no
module over 600 lines.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("countdown", "math", "short_answers", "rubric", "toy")


def is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def public_definitions(tree: ast.Module) -> set[str]:
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_")}


def measure(root: Path = ROOT) -> dict:
    lab, studies = root / "setpo_lab", root / "setpo_lab" / "studies"
    per_study: dict[str, int] = defaultdict(int)
    defined_in: dict[str, set[str]] = defaultdict(set)
    statements = 0
    lines = {}
    for path in sorted([*lab.rglob("*.py"), *(root / "setpo").rglob("*.py")]):
        text = path.read_text()
        lines[str(path.relative_to(root))] = len(text.splitlines())
        if lab not in path.parents:
            continue
        tree = ast.parse(text)
        statements += sum(isinstance(node, ast.stmt) and not is_docstring(node) for node in ast.walk(tree))
        study = next((s for s in STUDIES if path.stem.startswith(s)), None)
        if path.parent == studies and study is not None:
            names = public_definitions(tree)
            per_study[study] += len(names)
            for name in names:
                defined_in[name].add(path.stem)
    longest = max(lines, key=lines.get)
    return {"study_specific_names": dict(per_study), "study_specific_total": sum(per_study.values()),
            "defined_in_several": {n: sorted(m) for n, m in sorted(defined_in.items()) if len(m) > 1},
            "statements": statements, "longest_module": [longest, lines[longest]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the measures as JSON")
    args = ap.parse_args(argv)
    m = measure()
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    names = ", ".join(f"{s} {n}" for s, n in sorted(m["study_specific_names"].items(), key=lambda kv: -kv[1]))
    print(f"study-specific public names: {m['study_specific_total']} ({names})  [target <= 110]")
    several = m["defined_in_several"]
    print(f"names defined in two or more study modules: {len(several)}  [target <= 3]")
    for name, modules in several.items():
        print(f"  {name}: {', '.join(modules)}")
    print(f"statements in setpo_lab (docstrings not counted): {m['statements']}  [target <= 4000]")
    print(f"longest module: {m['longest_module'][0]}, {m['longest_module'][1]} lines  [target <= 600]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
