"""Interrupted runs resume to the same result: a run stopped at any point (an exception from inside training,
a kill mid-write leaving half a file or half a checkpoint folder) and started again ends with the same weights
and records, bit for bit on the CPU, as a run that was never interrupted. Damaged files and changed
configurations are refused with an error that names them."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import StopAt, run_records
from safetensors.torch import load_file

import setpo_lab.studies.toy as toy
from setpo_lab import ROOT
from setpo_lab.studies.countdown import (CountdownLMConfig, RLRun, claim_folder, load_config, make_data, train_rl, train_sft,
                                         run_study)
from setpo_lab.studies.sampling import sample_completions
from setpo_lab.studies.toy import ToyConfig, train
from setpo.trl import SetPOConfig
from setpo.trl.training import STAGING, generation_aligned_save_steps, last_checkpoint, read_records

# ---- the toy trainer --------------------------------------------------------------------------------------

SMALL = dict(steps=12, groups_per_step=4, snapshot_every=5, snapshot_samples=16, setpo=True)


def _same_run(a, b):
    for (k, x), y in zip(a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True):
        assert torch.equal(x, y), k
    assert a.history == b.history or json.dumps(a.history) == json.dumps(b.history)  # NaN-safe
    assert len(a.snapshots) == len(b.snapshots)
    for s, t in zip(a.snapshots, b.snapshots, strict=True):
        assert s["step"] == t["step"] and all(torch.equal(s[k], t[k]) for k in ("prompts", "tokens", "embeddings"))


@pytest.fixture(scope="module")
def toy_straight():
    return train(ToyConfig(**SMALL), progress=False)


class Killed(Exception):
    pass


@pytest.mark.parametrize("where", ["after_save", "mid_step"])
@pytest.mark.parametrize("at", [1, 4, 7])
def test_toy_interrupted_anywhere_resumes_bit_for_bit(toy_straight, tmp_path, monkeypatch, where, at):
    cfg = ToyConfig(checkpoint_dir=str(tmp_path), checkpoint_every=3, **SMALL)
    calls = {"n": 0}
    real_save, real_mass = toy._save, toy._mode_mass

    def save_then_die(path, step, *a):
        real_save(path, step, *a)
        if step >= at:
            raise Killed

    def die_mid_step(*a):
        calls["n"] += 1
        if calls["n"] == at:
            raise Killed
        return real_mass(*a)

    monkeypatch.setattr(toy, "_save" if where == "after_save" else "_mode_mass",
                        save_then_die if where == "after_save" else die_mid_step)
    with pytest.raises(Killed):
        train(cfg, progress=False)
    monkeypatch.undo()
    _same_run(toy_straight, train(cfg, progress=False))


def test_toy_sigkill_at_random_moments_resumes_bit_for_bit(toy_straight, tmp_path):
    """A real kill -9 of a training process, three times at different moments, then a run to the end."""
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from setpo_lab.studies.toy import ToyConfig, train
        import setpo_lab.studies.toy as toy, time
        real = toy._mode_mass
        def slow(*a):  # a few ms per step, so that kills land at different steps and inside saves
            time.sleep(0.05)
            return real(*a)
        toy._mode_mass = slow
        print("ready", flush=True)
        train(ToyConfig(checkpoint_dir={str(tmp_path)!r}, checkpoint_every=1, **{SMALL!r}), progress=False)
        print("done", flush=True)
    """)
    steps_seen = []
    for delay in (0.12, 0.2, 0.07):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ckpt = tmp_path / "checkpoint.pt"
        steps_seen.append(torch.load(ckpt, weights_only=True)["step"] if ckpt.exists() else 0)
    assert steps_seen[-1] < SMALL["steps"], "the kills came too late to interrupt anything"
    _same_run(toy_straight, train(ToyConfig(checkpoint_dir=str(tmp_path), checkpoint_every=1, **SMALL),
                                  progress=False))


def test_toy_resume_refuses_another_config_and_names_the_fields(tmp_path):
    cfg = ToyConfig(checkpoint_dir=str(tmp_path), **{**SMALL, "steps": 3, "setpo": False})
    train(cfg, progress=False)
    with pytest.raises(ValueError, match=r"different configuration.*lr.*seed.*setpo"):
        train(replace(cfg, setpo=True, lr=0.02, seed=3), progress=False)
    train(replace(cfg, steps=6), progress=False)  # training further is a resume, not a change
    with pytest.raises(ValueError, match="beyond steps=3"):
        train(cfg, progress=False)


def test_toy_damaged_checkpoint_is_named_and_never_unpickled(tmp_path):
    cfg = ToyConfig(checkpoint_dir=str(tmp_path), **{**SMALL, "steps": 3})
    train(cfg, progress=False)
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:-200])
    with pytest.raises(ValueError, match=r"^checkpoint\.pt: cannot be loaded; delete it"):
        train(cfg, progress=False)

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"step": 1, "policy": Payload()}, ckpt)
    with pytest.raises(ValueError, match="cannot be loaded"):
        train(cfg, progress=False)
    assert not marker.exists()


def test_toy_training_runs_on_one_thread_and_restores_the_callers_setting():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    real = toy._mode_mass
    toy._mode_mass = lambda *a: (seen.append(torch.get_num_threads()), real(*a))[1]
    try:
        train(ToyConfig(**{**SMALL, "steps": 2}), progress=False)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        toy._mode_mass = real
        torch.set_num_threads(before)


# ---- a tiny Countdown RL run on TRL -----------------------------------------------------------------------

RUN = RLRun("grpo", 3, 0.001, 0.5, embedder="hash")


@pytest.fixture(scope="module")
def countdown(tmp_path_factory):
    """A warm start and one uninterrupted 6-step RL run (checkpoints every 2 steps) to compare with."""
    root = tmp_path_factory.mktemp("countdown_resume")
    cfg = CountdownLMConfig.smoke(out=str(root), threads=1, rl_steps=6, rl_save_steps=2)
    torch.set_num_threads(1)
    data = make_data(cfg)
    sft = train_sft(cfg, data, root / "sft", log=lambda *_: None)
    train_rl(cfg, RUN, data, sft, root / "straight", log=lambda *_: None)
    straight = root / "straight"
    return cfg, data, sft, root, straight


def _assert_same(a: Path, b: Path):
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert run_records(a) == run_records(b)


def test_countdown_interrupted_at_every_kind_of_moment_resumes_bit_for_bit(countdown):
    cfg, data, sft, root, straight = countdown
    run_dir = root / "interrupted"

    def rl(*cb):
        return train_rl(cfg, RUN, data, sft, run_dir, log=lambda *_: None, callbacks=list(cb))

    # 1. stopped before the first checkpoint, and killed while appending to probes.jsonl
    with pytest.raises(KeyboardInterrupt):
        rl(StopAt(1))
    assert not last_checkpoint(run_dir)
    with (run_dir / "probes.jsonl").open("a") as f:
        f.write('{"step": 1, "problem": 0, "te')
    # 2. stopped mid-generation-batch, after checkpoint-2
    with pytest.raises(KeyboardInterrupt):
        rl(StopAt(3))
    assert Path(last_checkpoint(run_dir)).name == "checkpoint-2"
    # 3. killed while writing checkpoint-4: half of it in the staging folder, and (as an older, non-atomic
    #    save would leave) a checkpoint-4 without trainer_state.json
    shutil.copytree(run_dir / "checkpoint-2", run_dir / STAGING / "checkpoint-4")
    shutil.copytree(run_dir / "checkpoint-2", run_dir / "checkpoint-4")
    (run_dir / "checkpoint-4" / "trainer_state.json").unlink()
    (run_dir / "checkpoint-4" / "model.safetensors").write_bytes(b"half")
    assert Path(last_checkpoint(run_dir)).name == "checkpoint-2"  # the incomplete one is ignored
    with pytest.raises(KeyboardInterrupt):
        rl(StopAt(5))
    assert Path(last_checkpoint(run_dir)).name == "checkpoint-4" and not (run_dir / STAGING).exists()
    # 4. stopped after the last step, before the final model and records are written
    with pytest.raises(KeyboardInterrupt):
        rl(StopAt("end"))
    assert not (run_dir / "final" / "done.json").exists()
    rl()
    _assert_same(straight, run_dir)


def test_checkpoints_fall_on_generation_boundaries():
    args = SetPOConfig(output_dir="/tmp/unused", steps_per_generation=2, per_device_train_batch_size=3,
                       num_generations=3, save_strategy="steps", save_steps=3, report_to=[], use_cpu=True)
    assert generation_aligned_save_steps(args) == 4
    args.save_steps = 4
    assert generation_aligned_save_steps(args) == 4


def test_damaged_checkpoint_files_are_named(countdown, tmp_path):
    cfg, data, sft, _, _ = countdown
    cfg = replace(cfg, rl_steps=4)
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train_rl(cfg, RUN, data, sft, run_dir, log=lambda *_: None, callbacks=[StopAt(3)])
    ckpt = run_dir / "checkpoint-2"
    for name in ("optimizer.pt", "model.safetensors", "trainer_state.json"):
        saved = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(saved[: len(saved) // 2])
        with pytest.raises(ValueError, match=rf"checkpoint-2/{name}: (is damaged|cannot be loaded); delete checkpoint-2"):
            train_rl(cfg, RUN, data, sft, run_dir, log=lambda *_: None)
        (ckpt / name).write_bytes(saved)


def test_probe_file_half_line_is_dropped_and_a_damaged_line_named(tmp_path):
    path = tmp_path / "probes.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"st')
    assert read_records(path) == [{"step": 0}, {"step": 1}]
    path.write_text('{"step": 0}\n{"st\n{"step": 1}\n')
    with pytest.raises(ValueError, match="^probes.jsonl: line 2 cannot be loaded; delete the file"):
        read_records(path)


def test_sampling_leaves_torchs_global_rng_alone(countdown):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    *_, sft, _, _ = countdown
    tok = PreTrainedTokenizerFast.from_pretrained(str(sft))
    model = AutoModelForCausalLM.from_pretrained(str(sft), dtype=torch.float32)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = sample_completions(model, tok, ["1 2 3 = 6\n"], 4, temperature=1.0, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert sample_completions(model, tok, ["1 2 3 = 6\n"], 4, temperature=1.0, seed=5) == first


def test_study_folder_refuses_another_config_or_a_missing_one(tmp_path):
    cfg = CountdownLMConfig.smoke(out=str(tmp_path / "study"))
    claim_folder(cfg)
    claim_folder(replace(cfg, rl_save_steps=4))  # changes no result
    with pytest.raises(ValueError, match=r"different config.*threads: 2 there, 4 now"):  # another floating-point path
        claim_folder(replace(cfg, threads=4))
    old = json.loads((tmp_path / "study" / "config.json").read_text())
    (tmp_path / "study" / "config.json").write_text(json.dumps({**old, "rl_save_steps": 25}))  # before the rule
    assert load_config(tmp_path / "study").rl_save_steps == 26
    with pytest.raises(ValueError, match=r"different config.*rl_steps.*sft_lr"):
        claim_folder(replace(cfg, sft_lr=0.5, rl_steps=4))
    (tmp_path / "study" / "config.json").write_text('{"seed": 0, "n_tr')
    with pytest.raises(ValueError, match=r"^config\.json: cannot be loaded; (restore it or )?delete"):
        claim_folder(cfg)
    (tmp_path / "study" / "config.json").unlink()
    (tmp_path / "study" / "sft").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        run_study(replace(cfg, sft_lr=0.5), log=lambda *_: None)
    assert not (tmp_path / "study" / "config.json").exists()


def test_damaged_finished_model_is_named(countdown, tmp_path):
    from setpo_lab.studies import countdown_training

    *_, sft, _, _ = countdown
    broken = tmp_path / "sft" / "final"
    shutil.copytree(sft, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"^sft/final: cannot be loaded; delete sft and rerun"):
        countdown_training._load_trained(broken)
