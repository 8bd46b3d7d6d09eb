"""Whole studies over the library, the code the notebooks drive.

Each study is a short pipeline of named stages with one config dataclass, resumable from what it has
already written:

- ``toy``: the multi-modal bandit of the paper's Figure 1, GRPO vs SetPO (notebook 01, ``make demo``);
- ``countdown`` (+ ``countdown_results`` to read a finished run): a tiny Qwen2 model on Countdown, SFT warm
  start, GRPO vs SetPO+GRPO, pass@k and distinct solutions (notebook 03);
- ``math``: Qwen2.5-Math (or a tiny model of the same architecture on the CPU) on GSM8K-style data (notebook 04);
- ``rubric``: SetGRPO on the rubric-graded toy (notebook 05).

Shared by them: ``figures`` (every figure: an interactive plotly HTML and its static PNG twin),
``sampling`` (generation from a transformers model) and ``tiny_models`` (models built from a config).
"""
