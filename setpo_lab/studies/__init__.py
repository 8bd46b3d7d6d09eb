"""Whole studies over the library, the code the notebooks drive.

Every study has one shape, resumable from what it has already written: ``<study>_config`` (one config
dataclass), ``<study>`` (its named stages ``STAGES`` and ``run_study(cfg, stages=None, *, log=print_flushed)``,
None running every stage, Countdown's with ``redo`` besides, returning a ``stages.StudyResult``: the study's
folder, its runs by name, the report's summary and the seconds it took; and ``COMMAND``, its command line
``python -m setpo_lab run <study>``, ``arguments.StudyCommand``) and
``<study>_results`` (reading what the stages wrote: tables, figures, records). Stages call results, results
read configs, never the other way round.

- ``toy``: the multi-modal bandit of the paper's Figure 1, GRPO vs SetPO (notebook 01, ``make demo``);
- ``countdown``: a tiny Qwen2 model on Countdown, SFT warm start, GRPO vs SetPO+GRPO, pass@k and distinct
  solutions (notebook 03, ``python -m setpo_lab run countdown``);
- ``short_answers``: SmolLM2-135M-Instruct on short-answer number tasks, the base model's table and GRPO vs
  SetPO+GRPO over paired seeds (notebook 04, ``python -m setpo_lab run short_answers``), its
  extension with the kernel kept where the reward reads (``run short_answers_cure``) and the confirmatory test
  (``run short_answers_confirm``);
- ``math``: Qwen2.5-Math (or a tiny model of the same architecture on the CPU) on GSM8K-style data (notebook 06,
  ``python -m setpo_lab run math``);
- ``rubric``: SetGRPO on the rubric-graded toy (notebook 05, ``python -m setpo_lab run rubric``).

Shared by them: ``stages`` (is a stage done, which stages to run, claiming a run folder for one config,
refusals that end with the file and what to do, progress lines), ``judging`` (the optional LLM judge of the
math and Countdown studies' stage "judge": the judged diversity per method, ``setpo.judge``), ``figures``
(every figure: an interactive plotly HTML, its static PNG twin drawn by ``static_render``, a run record, and
the builders the studies share), ``sampling`` (generation from a transformers model) and ``arguments``
(the one study command line and its checks); the tiny models built from a config are ``setpo.trl.tiny_models`` (verl's CPU demo uses
them too). ``explain`` draws notebook 02; ``notebook_runs``
runs notebooks headless.
"""
