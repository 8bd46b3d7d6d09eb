"""What every study's training run tells TRL the same way, written once: a run is seeded (data order too),
logs every step to no tracker, keeps one checkpoint to resume from, and runs on the CPU unless a GPU is asked
for (``run_arguments``); an RL run also samples at top-p 1 with a constant learning rate and no warm-up, and
checkpoints every ``save_steps`` (``rl_trainer_args``). Each study passes only what is its own."""

from __future__ import annotations

from pathlib import Path


def run_arguments(seed: int, *, on_cpu: bool = True, bf16: bool = False) -> dict:
    """The trainer arguments every study's runs share (SFT or RL), for ``seed``."""
    return dict(report_to=[], use_cpu=on_cpu, bf16=bf16, seed=seed, data_seed=seed, save_total_limit=1,
                disable_tqdm=True, logging_steps=1, dataloader_num_workers=0)


def rl_trainer_args(preset: str, output_dir: str | Path, *, seed: int, save_steps: int, on_cpu: bool = True,
                    bf16: bool = False, **settings):
    """The ``SetPOConfig`` (``setpo.trl.config_for(preset)``) of one RL run: the shared arguments above, and the
    study's own ``settings`` (group size, λ, lengths, learning rate, batch shape, ...)."""
    from setpo.trl import config_for  # imports TRL

    return config_for(preset, output_dir=str(output_dir), top_p=1.0, lr_scheduler_type="constant", warmup_steps=0,
                      save_strategy="steps", save_steps=save_steps, **run_arguments(seed, on_cpu=on_cpu, bf16=bf16),
                      **settings)
