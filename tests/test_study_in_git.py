"""A study folder kept in git (``results/``: the records and the warm start's model, no other model) resumes
in a new checkout: what is evaluated is never trained again, and a model needed again is trained again and
must match the SHA-256 its done.json recorded, bit for bit, or it is refused (a study longer than one sitting
goes on from any checkout)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from setpo_lab.studies.countdown import CountdownLMConfig, run_study
from setpo_lab.studies.stages import RestoreMismatch
from setpo.trl.training import DONE_FILE, weights_sha256

ROOT = Path(__file__).resolve().parent.parent
SEARCH_RUN = "grpo_G3_b0.001_s1000"  # GRPO on the validation search's first seed (SEARCH_SEED_BASE)


def _without_models(folder: Path) -> None:
    """A study folder with no model at all: a new checkout's holds only the warm start's (``results/.gitignore``),
    so this is the harder case."""
    for final in folder.rglob("final"):
        for f in final.iterdir():
            if f.name != DONE_FILE:
                f.unlink()


def _records(folder: Path) -> dict:
    """Every JSON record a checkout of a study folder holds, minus wall-clock seconds (the only thing allowed to
    differ) and the folder's own path."""
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in ("seconds", "timings", "out")}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value
    kept = [p for p in sorted(folder.rglob("*.json")) if p.parent.name != "final" or p.name == DONE_FILE]
    return {str(p.relative_to(folder)): clean(json.loads(p.read_text())) for p in kept}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    cfg = CountdownLMConfig.smoke(out=str(tmp_path_factory.mktemp("in_git") / "made"), threads=1, other_cells=(),
                                  rl_seeds=(0,), dra_embedders=("hash",), eval_temperatures=(1.0,))
    _run(cfg)
    return cfg


def _copy(cfg, to: Path) -> CountdownLMConfig:
    shutil.copytree(cfg.out, to)
    _without_models(to)
    return CountdownLMConfig(**{**json.loads((to / "config.json").read_text()), "out": str(to)})


def _run(cfg) -> list[str]:
    logs: list[str] = []
    before = torch.get_num_threads()
    try:
        run_study(cfg, log=logs.append)
    finally:
        torch.set_num_threads(before)
    return logs


def test_done_json_records_the_weights_hash(study):
    final = Path(study.out) / "sft" / "final"
    assert json.loads((final / DONE_FILE).read_text())["weights_sha256"] == weights_sha256(final)
    assert weights_sha256(final.parent) is None  # no weights there


def test_a_checkout_without_models_trains_nothing_it_has_evaluated(study, tmp_path):
    cfg = _copy(study, tmp_path / "checkout")
    logs = _run(cfg)
    assert not [line for line in logs if "not here" in line or line.startswith("[sft] step")]
    assert _records(Path(cfg.out)) == _records(Path(study.out))


def test_a_missing_evaluation_retrains_its_model_to_the_recorded_weights(study, tmp_path):
    cfg = _copy(study, tmp_path / "checkout")
    out = Path(cfg.out)
    test_eval = next(p for p in sorted((out / "eval").glob("grpo_*_T1.json")) if "setpo" in p.name)
    val_eval = out / "val" / f"{SEARCH_RUN}_T1.json"
    test_eval.unlink()
    val_eval.unlink()
    logs = _run(cfg)
    restored = sorted(line.split()[1].rstrip(":") for line in logs if "not here" in line)
    assert restored == sorted(["the", SEARCH_RUN, test_eval.stem[:-len("_T1")]])  # "the" warm start
    assert _records(out) == _records(Path(study.out))  # the same evaluations, records and done.json as the first time
    for name in ("sft", f"rl/{SEARCH_RUN}"):
        assert weights_sha256(out / name / "final") == weights_sha256(Path(study.out) / name / "final")
        assert (out / name / "log_history.json").read_bytes() == (Path(study.out) / name / "log_history.json").read_bytes()


def _recorded_elsewhere(cfg) -> tuple[Path, Path]:
    """A checkout whose search run records other weights than this machine makes (as a study begun on an
    AVX2 machine and resumed on an AVX-512 one), its validation evaluation missing: (its done.json, its log)."""
    out = Path(cfg.out)
    done = out / "rl" / SEARCH_RUN / "final" / DONE_FILE
    done.write_text(json.dumps({**json.loads(done.read_text()), "weights_sha256": "0" * 64}))
    log = out / "rl" / SEARCH_RUN / "log_history.json"
    log.write_text(log.read_text().replace('"loss"', '"loss_elsewhere"'))  # the other machine's log
    (out / "val" / f"{SEARCH_RUN}_T1.json").unlink()
    return done, log


def test_a_retrained_model_with_other_weights_is_refused_and_the_record_kept(study, tmp_path):
    cfg = _copy(study, tmp_path / "checkout")
    done, log = _recorded_elsewhere(cfg)
    recorded_log = log.read_bytes()
    with pytest.raises(RestoreMismatch, match=rf"run {SEARCH_RUN}, trained again .* gave other weights .*"
                                              r"0{12} recorded.*--redo"):
        _run(cfg)
    final = done.parent
    assert not (final / "model.safetensors").exists() and not done.exists()
    assert json.loads((final / "done.recorded.json").read_text())["weights_sha256"] == "0" * 64  # asked again next time
    assert log.read_bytes() == recorded_log  # the recorded run's log, not the refused retraining's


def test_redo_makes_a_run_that_cannot_be_restored_again_here_with_its_evaluations(study, tmp_path):
    cfg = _copy(study, tmp_path / "checkout")
    done, log = _recorded_elsewhere(cfg)
    logs: list[str] = []
    before = torch.get_num_threads()
    try:
        run_study(cfg, log=logs.append, redo=True)
    finally:
        torch.set_num_threads(before)
    assert any(f"{SEARCH_RUN}: its model cannot be restored on this machine; --redo" in line for line in logs)
    assert json.loads(done.read_text())["weights_sha256"] == weights_sha256(done.parent)  # this machine's run
    assert not (done.parent / "done.recorded.json").exists()
    assert "loss_elsewhere" not in log.read_text()
    # made again here, it is what this machine makes: the same weights, evaluations and records (but wall-clock)
    assert weights_sha256(done.parent) == weights_sha256(Path(study.out) / "rl" / SEARCH_RUN / "final")
    timed = {f"rl/{SEARCH_RUN}/timings.json", f"rl/{SEARCH_RUN}/log_history.json"}
    assert ({k: v for k, v in _records(Path(cfg.out)).items() if k not in timed}
            == {k: v for k, v in _records(Path(study.out)).items() if k not in timed})


def test_evaluating_without_training_a_missing_model_says_how_to_get_it(study, tmp_path):
    cfg = _copy(study, tmp_path / "checkout")
    (Path(cfg.out) / "eval" / "sft_T1.json").unlink()
    with pytest.raises(ValueError, match=r"its model is not here.*--stages train,evaluate"):
        run_study(cfg, log=lambda *_: None, stages=["evaluate"])


def test_git_keeps_the_records_and_leaves_the_models_out():
    paths = ["results/countdown/rl/run/final/model.safetensors", "results/countdown/rl/run/final/tokenizer.json",
             "results/countdown/rl/run/checkpoint-20/optimizer.pt", "results/countdown/eval/sft_T1.texts.json",
             "results/countdown/rl/run/final/done.json", "results/countdown/rl/run/log_history.json",
             "results/countdown/eval/sft_T1.json", "results/countdown/replication/rl/run/final/done.json",
             "results/countdown/sft/final/model.safetensors", "results/countdown/replication/sft/final/tokenizer.json"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == paths[:4]


def test_the_record_says_which_machine_trained_and_evaluated_each_row(study):
    """A study of several sittings may have had several machines (another one's kernels give other weights):
    every row names the processor that trained it and the one that evaluated it, and the record counts them."""
    from setpo_lab.repro.provenance import machine
    from setpo_lab.repro import agreement

    summary = json.loads((Path(study.out) / "results.json").read_text())
    here = agreement._machine_label(machine())
    assert here != "unrecorded"
    assert {r["trained_on"] for r in summary["runs"]} == {r["evaluated_on"] for r in summary["runs"]} == {here}
    assert summary["machines"] == {"trained": {here: len(summary["runs"])}, "evaluated": {here: len(summary["runs"])}}
    assert f"Made on: trained by {here} ({len(summary['runs'])} rows)" in (Path(study.out) / "results.md").read_text()


def test_machine_label_names_the_widest_vector_extension():
    from setpo_lab.repro import agreement

    label = agreement._machine_label
    assert label({"cpu": "AMD EPYC", "vector": ["avx2", "fma", "avx512f"], "flags_sha256": "6a93d771884cba54"}) \
        == "AMD EPYC avx512f 6a93d771"
    assert label({"cpu": "AMD EPYC", "vector": ["avx2"], "flags_sha256": None}) == "AMD EPYC avx2"
    assert label(None) == label({}) == "unrecorded"


def test_make_countdown_installs_the_versions_the_committed_record_was_made_at():
    """A fresh install resolves the newest releases, and the study refuses to resume at other versions than its
    identity.json records (accelerate 1.16.0 and sentence-transformers 6.3.0 came out after the record was
    made, and a fresh clone's make countdown refused it): results/countdown/requirements.txt pins every
    recorded result-bearing package, torch through the Makefile's TORCH_SPEC, and make countdown installs it."""
    import re

    recorded = json.loads((ROOT / "results/countdown/identity.json").read_text())["versions"]
    lines = (ROOT / "results/countdown/requirements.txt").read_text().splitlines()
    pinned = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert pinned == {k: v for k, v in recorded.items() if k != "torch"}
    makefile = (ROOT / "Makefile").read_text()
    torch_spec = re.search(r"^TORCH_SPEC\s*\?=\s*torch==(\S+)", makefile, re.M).group(1)
    assert recorded["torch"].split("+")[0] == torch_spec
    recipe = makefile.split("\ncountdown:")[1].split("\n\n")[0]
    assert "install -q -r results/countdown/requirements.txt" in recipe
    assert recipe.index("requirements.txt") < recipe.index("setpo_lab.cli countdown")
