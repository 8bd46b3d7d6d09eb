"""A checkpoint that has lost a file: the Trainer resumes without rng_state.pth, optimizer.pt or
scheduler.pt and quietly trains a different run. ``setpo.trl.training`` refuses such a checkpoint, naming the
missing file and what to do, for every file the checkpoint was saved with; a checkpoint from before the file
list existed is held to the files a resume reads, and anything else it lacks does not change the run.

Through a tiny Countdown RL run on TRL (the studies resume through ``train_resumable``, so this covers each)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import StopAt, run_records
from safetensors.torch import load_file

import setpo_lab.studies.countdown as study
from setpo_lab.studies.countdown import CountdownLMConfig, RLRun, make_data
from setpo.trl.training import MANIFEST, check_checkpoint, last_checkpoint

# the stage functions' names (the studies are being refactored: run_* became train_*)
train_sft = getattr(study, "train_sft", None) or getattr(study, "run_sft")  # noqa: B009 - old name, may be gone
train_rl = getattr(study, "train_rl", None) or getattr(study, "run_rl")  # noqa: B009 - old name, may be gone

RUN = RLRun("grpo", 3, 0.001, 0.5, embedder="hash")
QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A warm start, an uninterrupted 4-step RL run (checkpoints every 2 steps), and a copy of that run's folder
    as it was when stopped at step 3 (last checkpoint: checkpoint-2)."""
    root = tmp_path_factory.mktemp("resume_missing")
    cfg = CountdownLMConfig.smoke(out=str(root), threads=1, rl_steps=4, rl_save_steps=2)
    torch.set_num_threads(1)
    data = make_data(cfg)
    sft = train_sft(cfg, data, root / "sft", **QUIET)
    train_rl(cfg, RUN, data, sft, root / "straight", **QUIET)
    with pytest.raises(KeyboardInterrupt):
        train_rl(cfg, RUN, data, sft, root / "stopped", callbacks=[StopAt(3)], **QUIET)
    assert Path(last_checkpoint(root / "stopped")).name == "checkpoint-2"
    return cfg, data, sft, root


def _fresh_copy(root: Path, name: str) -> Path:
    run_dir = root / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(root / "stopped", run_dir)
    return run_dir


def _assert_same(a: Path, b: Path):
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert run_records(a) == run_records(b)


def test_a_resume_without_rng_state_is_refused_before_training(runs):
    """The issue's case: rng_state.pth deleted from the last checkpoint. The rerun exited 0 with a log_history
    that differed from the uninterrupted run's from step 3 on; now it is refused, naming the file and the fix."""
    cfg, data, sft, root = runs
    run_dir = _fresh_copy(root, "no_rng")
    (run_dir / "checkpoint-2" / "rng_state.pth").unlink()
    with pytest.raises(ValueError, match=r"checkpoint-2/rng_state\.pth: is missing; delete checkpoint-2") as err:
        train_rl(cfg, RUN, data, sft, run_dir, **QUIET)
    assert "\n" not in str(err.value)
    assert not (run_dir / "final").exists() and not (run_dir / "checkpoint-4").exists()  # nothing trained
    # doing what the message says (delete the checkpoint) gives the uninterrupted run
    shutil.rmtree(run_dir / "checkpoint-2")
    train_rl(cfg, RUN, data, sft, run_dir, **QUIET)
    _assert_same(root / "straight", run_dir)


def test_every_file_a_checkpoint_holds_is_checked(runs):
    """Each file of the checkpoint, removed in turn, is named; so is one whose size changed."""
    *_, root = runs
    ckpt = Path(last_checkpoint(root / "stopped"))
    listed = json.loads((ckpt / MANIFEST).read_text())["files"]
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            "training_args.bin", "config.json"} <= set(listed)
    assert listed == {f.name: f.stat().st_size for f in ckpt.iterdir() if f.name != MANIFEST}
    check_checkpoint(ckpt)
    work = _fresh_copy(root, "each_file") / ckpt.name
    for name in listed:
        saved = work / name
        saved.rename(work.parent / "aside")
        with pytest.raises(ValueError, match=rf"{ckpt.name}/{name}: is missing; delete "):
            check_checkpoint(work)
        (work.parent / "aside").rename(saved)
    with (work / "tokenizer_config.json").open("a") as f:
        f.write(" ")  # still valid JSON, but not the file that was saved
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: is damaged; delete .*\(cause: \d+ bytes, \d+ when saved"):
        check_checkpoint(work)
    (work / MANIFEST).write_text('{"files": ')
    with pytest.raises(ValueError, match=rf"{MANIFEST}: cannot be loaded; delete "):
        check_checkpoint(work)


def test_a_checkpoint_saved_without_a_file_list_needs_what_a_resume_reads(runs):
    """Checkpoints written before the file list existed: a file the Trainer reads on resume must be there;
    the others (config, tokenizer, training arguments, the list itself) are not read, and the run resumed
    without them is the uninterrupted run, bit for bit."""
    cfg, data, sft, root = runs
    run_dir = _fresh_copy(root, "old_style")
    ckpt = run_dir / "checkpoint-2"
    (ckpt / MANIFEST).unlink()
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (ckpt / name).rename(run_dir / "aside")
        with pytest.raises(ValueError, match=rf"checkpoint-2/{name}: is missing; delete "):
            check_checkpoint(ckpt)
        (run_dir / "aside").rename(ckpt / name)
    for f in ckpt.iterdir():
        if f.name not in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
            f.unlink()
    train_rl(cfg, RUN, data, sft, run_dir, **QUIET)
    _assert_same(root / "straight", run_dir)


def test_a_checkpoint_without_trainer_state_is_incomplete_and_the_run_starts_over_identically(runs):
    """trainer_state.json is what the Trainer writes last: a checkpoint without it is one a kill interrupted, so
    it is not resumed from; the run starts over (here: from step 0) and ends as the uninterrupted one."""
    cfg, data, sft, root = runs
    run_dir = _fresh_copy(root, "no_state")
    (run_dir / "checkpoint-2" / "trainer_state.json").unlink()
    assert last_checkpoint(run_dir) is None
    logs = []
    train_rl(cfg, RUN, data, sft, run_dir, log=logs.append)
    assert not any("resuming" in line for line in logs)
    _assert_same(root / "straight", run_dir)
