"""Shared test helpers. tests/ has no __init__.py, so pytest's default (prepend) import mode puts this folder
on sys.path and test files import these as ``from helpers import ...``."""

from transformers import TrainerCallback


class StopAt(TrainerCallback):
    """Raises KeyboardInterrupt at the start of step ``at`` (or at the end of training with ``at="end"``): an
    interruption from inside the Trainer, like a killed process (checkpoints up to then already saved)."""

    def __init__(self, at=None):
        self.at = at

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == self.at:
            raise KeyboardInterrupt

    def on_train_end(self, args, state, control, **kw):
        if self.at == "end":
            raise KeyboardInterrupt


#: log_history keys that hold wall-clock times, which differ between two otherwise identical runs.
TIME_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def run_records(run_dir) -> dict:
    """What a finished TRL run folder records, minus wall-clock times: two runs that trained the same way
    (one interrupted and resumed, one straight through) give equal dicts."""
    import json
    from pathlib import Path

    run_dir = Path(run_dir)
    hist = json.loads((run_dir / "log_history.json").read_text())
    done = json.loads((run_dir / "final" / "done.json").read_text())
    return {"log_history": [{k: v for k, v in h.items() if k not in TIME_KEYS} for h in hist],
            "done": {k: v for k, v in done.items() if k != "seconds"},
            "probes": (run_dir / "probes.jsonl").read_text() if (run_dir / "probes.jsonl").exists() else None}


def quiet_trainer(tok, model, tmp_path, prompts, g, **kwargs):
    """A SetPOTrainer on a copy of ``model`` that only rolls out: λ = 0, no diversity logging, a reward of 0, G = g
    rollouts of each of ``prompts`` per step (the fast-path tests compare its rollouts with TRL's own)."""
    import copy

    from datasets import Dataset

    from setpo.trl import SetPOConfig, SetPOTrainer

    args = SetPOConfig(output_dir=str(tmp_path), num_generations=g, per_device_train_batch_size=len(prompts) * g,
                       max_completion_length=8, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                       temperature=1.0, beta=0.0, seed=0, disable_tqdm=True, setpo_lambda=0.0,
                       setpo_log_diversity=False, **kwargs)
    return SetPOTrainer(model=copy.deepcopy(model), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                        args=args, train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                        processing_class=tok)


def score_batch(trainer, prompts, g, seed=0):
    """One generation batch as TRL's sampler hands it over (each prompt g times in a row), generated and scored
    in train mode from torch seed ``seed``."""
    import torch

    trainer.model.train()
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions([{"prompt": p} for p in prompts for _ in range(g)])


def completion_texts(trainer, out):
    """The completions of a scored batch as text, special tokens dropped."""
    return trainer.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)


def packed_rows(rows, pad_token_id, gen):
    """(prompt ids, completion ids) pairs as a left-padded prompt block of width P and a right-padded completion
    block of width C, rows shuffled by ``gen``: (ids (N, P + C), attention mask, P, C)."""
    import torch

    P, C = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    ids = torch.full((len(rows), P + C), pad_token_id)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, P - len(p):P], mask[i, P - len(p):P] = torch.tensor(p), 1
        ids[i, P:P + len(c)], mask[i, P:P + len(c)] = torch.tensor(c), 1
    order = torch.randperm(len(rows), generator=gen)
    return ids[order], mask[order], P, C
