"""scripts/lab_concepts.py: issue 58's measures of the lab, checked on a small made-up tree."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lab_concepts.py"


def load():
    spec = importlib.util.spec_from_file_location("lab_concepts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measures_a_made_up_lab(tmp_path):
    studies = tmp_path / "setpo_lab" / "studies"
    studies.mkdir(parents=True)
    (tmp_path / "setpo").mkdir()
    (tmp_path / "setpo" / "core.py").write_text("x = 1\n" * 7)
    (studies / "toy.py").write_text('"""doc"""\ndef run(): return 1\ndef _hidden(): pass\nclass Config:\n    a = 1\n')
    (studies / "toy_results.py").write_text("def run():\n    '''doc'''\n    return 2\nNAME = 3\n")
    (studies / "math.py").write_text("def evaluate(): pass\n")
    (studies / "stages.py").write_text("def run(): pass\n")          # shared, not a study's
    m = load().measure(tmp_path)
    assert m["study_specific_names"] == {"toy": 3, "math": 1}       # run, Config, run (toy_results); evaluate
    assert m["study_specific_total"] == 4
    assert m["defined_in_several"] == {"run": ["toy", "toy_results"]}
    # toy: def, return, def, pass, class, assign; toy_results: def, return, assign; math: def, pass; stages: def, pass
    assert m["statements"] == 13
    assert m["longest_module"] == ["setpo/core.py", 7]


def test_runs_on_the_repository(capsys):
    assert load().main([]) == 0
    assert "study-specific public names" in capsys.readouterr().out
