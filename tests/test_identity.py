"""A run's identity is its thread count, the code it runs and the packages' versions; a study
folder, a run folder or a cached evaluation made at another identity is refused with the differing field
named, or remade when asked (``--redo``); and two runs at the same setting give identical weights and records."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import run_records

import setpo_lab.studies.countdown as countdown
from setpo_lab.repro.provenance import code_identity, identity_differences, import_closure, run_identity
from setpo_lab.studies.countdown import CountdownLMConfig, run_study, study_identity
from setpo_lab.studies.stages import claim_identity, reusable_record


def test_the_code_is_every_module_the_study_can_import_but_not_what_only_draws():
    closure = import_closure(countdown.IDENTITY_MODULES, exclude=countdown.NOT_IN_IDENTITY)
    # through the lazy package export (``from setpo.trl import SetPOTrainer``) and imports inside functions
    # the shared model loader is the study's code: how a tokenizer is read changes the runs (toolkit.load_tokenizer)
    assert {"setpo.trl.trainer", "setpo.trl.config", "setpo.diversity", "setpo.envs.countdown.verifier",
            "setpo_lab.studies.countdown_config", "setpo.embed", "setpo_lab.studies.toolkit"} <= set(closure)
    assert not {"setpo_lab.studies.figures", "setpo_lab.studies.countdown_results", "setpo.judge.client",
                "setpo.verl.launch", "setpo_lab.studies.intervals"} & set(closure)


def test_differences_name_threads_files_and_versions_but_not_the_commit_alone(tmp_path):
    (tmp_path / "setpo").mkdir()
    (tmp_path / "setpo" / "__init__.py").write_text("")
    (tmp_path / "setpo" / "a.py").write_text("from setpo import b\n")
    (tmp_path / "setpo" / "b.py").write_text("X = 1\n")
    before = {"threads": 2, "code": code_identity(["setpo.a"], tmp_path), "versions": {"torch": "2.13.0"}}
    assert set(before["code"]["files"]) == {"setpo/__init__.py", "setpo/a.py", "setpo/b.py"}
    assert identity_differences(before, {**before, "code": {**before["code"], "commit": "other", "dirty": True}}) == {}
    (tmp_path / "setpo" / "b.py").write_text("X = 2\n")
    now = {"threads": 1, "code": code_identity(["setpo.a"], tmp_path), "versions": {"torch": "2.14.0"}}
    differ = identity_differences(before, now)
    assert differ["threads"] == "2 then, 1 now" and differ["versions.torch"] == "2.13.0 then, 2.14.0 now"
    assert differ["code"].startswith("setpo/b.py differ") and "a.py" not in differ["code"]


def test_a_folder_or_record_made_at_another_identity_is_refused_or_remade(tmp_path):
    ident = run_identity(2, ["setpo_lab.studies.stages"])
    other = {**ident, "threads": 1}
    run = tmp_path / "run"
    claim_identity(run, ident)
    (run / "weights.bin").write_text("w")
    claim_identity(run, ident)  # the same identity: kept
    with pytest.raises(ValueError, match=r"another identity \(threads: 2 then, 1 now\).*--redo"):
        claim_identity(run, other)
    assert (run / "weights.bin").exists()  # refused: nothing lost
    claim_identity(run, other, redo=True)
    assert not (run / "weights.bin").exists() and json.loads((run / "identity.json").read_text())["threads"] == 1
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "weights.bin").write_text("w")
    with pytest.raises(ValueError, match="no identity.json"):
        claim_identity(legacy, ident)
    record = tmp_path / "eval.json"
    record.write_text(json.dumps({"accuracy": 0.5, "identity": ident}))
    assert reusable_record(record, ident)["accuracy"] == 0.5
    with pytest.raises(ValueError, match="threads: 2 then, 1 now"):
        reusable_record(record, other)
    assert reusable_record(record, other, redo=True) is None and not record.exists()


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory):
    """The smoke study twice at the same setting, in two folders, from scratch."""
    root = tmp_path_factory.mktemp("identity")
    before = torch.get_num_threads()
    try:
        cfgs = [CountdownLMConfig.smoke(out=str(root / name), threads=1, other_cells=(), rl_seeds=(0,),
                                        dra_embedders=("hash",), eval_temperatures=(1.0,)) for name in ("a", "b")]
        for cfg in cfgs:
            run_study(cfg, log=lambda *_: None)
    finally:
        torch.set_num_threads(before)
    return cfgs


def test_two_runs_at_the_same_setting_give_identical_weights_and_records(two_studies):
    from safetensors.torch import load_file

    a, b = (Path(cfg.out) for cfg in two_studies)
    runs = sorted(p.name for p in (a / "rl").iterdir())
    assert runs == sorted(p.name for p in (b / "rl").iterdir()) and len(runs) >= 6
    for name in ["sft", *(f"rl/{r}" for r in runs)]:
        wa, wb = (load_file(str(f / name / "final" / "model.safetensors")) for f in (a, b))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name
        assert run_records(a / name) == run_records(b / name), name
    for folder in ("val", "eval"):
        for path in sorted((a / folder).glob("*.json")):
            ra, rb = (json.loads(p.read_text()) for p in (path, b / folder / path.name))
            assert {k: v for k, v in ra.items() if k != "seconds"} == {k: v for k, v in rb.items() if k != "seconds"}
    summary = lambda f: {k: v for k, v in json.loads((f / "results.json").read_text()).items()  # noqa: E731
                         if k not in ("config", "timings")}
    assert summary(a) == summary(b)


def test_the_study_refuses_another_thread_count_or_code_and_remakes_on_redo(two_studies, monkeypatch):
    cfg = two_studies[0]
    with pytest.raises(ValueError, match=r"different config.*threads: 1 there, 2 now"):
        run_study(replace(cfg, threads=2), log=lambda *_: None)
    changed = study_identity(cfg)
    changed["code"]["files"]["setpo/diversity.py"] = "0" * 16
    monkeypatch.setattr(countdown, "study_identity", lambda c: changed)
    with pytest.raises(ValueError, match=r"another identity \(code: setpo/diversity.py differ.*--redo"):
        run_study(cfg, log=lambda *_: None)
    # a run folder copied in from elsewhere is checked on its own too
    rl = Path(cfg.out) / "rl"
    run = next(rl.iterdir())
    assert json.loads((run / "identity.json").read_text()) == json.loads((Path(cfg.out) / "identity.json").read_text())
    logs = []
    run_study(cfg, log=logs.append, stages=["train"], redo=True)  # redo: the study's outputs go, every model is remade
    assert any(line.startswith("[sft]") for line in logs) and any(line.startswith("[rl]") for line in logs)
    assert json.loads((Path(cfg.out) / "identity.json").read_text()) == changed
    assert all(json.loads((r / "identity.json").read_text()) == changed for r in rl.iterdir())


def test_the_replication_is_the_whole_study_again_at_another_thread_count(tmp_path):
    before = torch.get_num_threads()
    try:
        cfg = CountdownLMConfig.smoke(out=str(tmp_path / "study"), threads=1, replication_threads=2, other_cells=(),
                                      rl_seeds=(0, 1), eval_temperatures=(1.0,))
        result = run_study(cfg, log=lambda *_: None)
    finally:
        torch.set_num_threads(before)
    summary = result.summary
    assert result.study == "countdown" and result.out == tmp_path / "study" and result.seconds > 0
    assert set(result.runs) == {r["name"] for r in summary["runs"]}  # its rows by run, a row per temperature
    assert all(row["name"] == name for name, rows in result.runs.items() for row in rows)
    rep = tmp_path / "study" / "replication"
    assert json.loads((rep / "config.json").read_text())["threads"] == 2
    assert json.loads((rep / "identity.json").read_text())["threads"] == 2
    assert sorted(p.name for p in (rep / "rl").iterdir()) == sorted(p.name for p in (tmp_path / "study" / "rl").iterdir())
    assert {r["threads"] for r in summary["replication"]["runs"]} == {2} and {r["threads"] for r in summary["runs"]} == {1}
    assert {r["replication"] for r in summary["replication"]["runs"]} == {1}
    assert set(summary["agreement"]) == {"primary", "replication"}
    runs = {r["name"] for r in summary["runs"]}
    searches = {p.name for p in (tmp_path / "study" / "rl").iterdir()} - runs  # trained, not in the test rows
    assert summary["identical"]["models"] == len(runs | searches)
    assert summary["identical"]["evaluations"] >= len(summary["runs"])  # the test split's, and the validation's
    for row in summary["runs"]:  # each row carries its model's digest, as its done.json recorded it
        folder = tmp_path / "study" / ("sft" if row["name"] == "sft" else f"rl/{row['name']}")
        assert row["weights_sha256"] == json.loads((folder / "final" / "done.json").read_text())["weights_sha256"]
    assert json.loads((tmp_path / "study" / "results.json").read_text())["agreement"] == summary["agreement"]
    assert "Replication (the whole study again" in (tmp_path / "study" / "results.md").read_text()
    with pytest.raises(ValueError, match="replication_threads"):
        CountdownLMConfig.smoke(threads=2, replication_threads=2)


def test_headline_seeds_may_grow_on_a_folder_and_add_only_the_headline_pair(tmp_path):
    from setpo_lab.studies.countdown_config import claim_folder

    cfg = CountdownLMConfig.smoke(out=str(tmp_path / "study"))
    claim_folder(cfg)
    grown = replace(cfg, headline_seeds=(5, 6))
    claim_folder(grown)  # a longer list: accepted, and recorded
    assert json.loads((tmp_path / "study" / "config.json").read_text())["headline_seeds"] == [5, 6]
    for other in ((6,), (5,), (7, 5, 6)):  # not an extension of what the folder holds
        with pytest.raises(ValueError, match="headline_seeds"):
            claim_folder(replace(cfg, headline_seeds=other))
    chosen = {"setpo": cfg.search_runs()[0]}
    extra = set(cfg.final_runs({**chosen})) ^ set(grown.final_runs({**chosen}))
    assert {(r.variant, r.seed) for r in extra} == {(v, s) for v in ("GRPO", chosen["setpo"].variant) for s in (5, 6)}
    with pytest.raises(ValueError, match="headline_seeds"):
        CountdownLMConfig.smoke(headline_seeds=(1,))  # already an rl seed
