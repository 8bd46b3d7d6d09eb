"""The short-answer study, extended: does SetPO keep more right answers than GRPO once its term is kept where the
reward reads? (docs/studies/short_answers.md)

The committed study found SetPO+GRPO's diversity paid in text after the answer line. This study trains, from the
same base model, tasks and budget, the arms of ``setpo_lab.studies.short_answers_config.ARMS``: SetPO with the answer
embedded by MiniLM, SetPO with the answer-key kernel, the answer-key kernel gated to right answers
(``setpo.reads``), and Pass@k Training (a peer known to keep pass@k); the committed study's GRPO and
whole-completion SetPO runs are reused from its folder when their training settings agree. Each arm's λ comes from
the pilot (``--preset pilot``: the validation split, never test).

The stages are the study's (``short_answers.run_study``; resumable, a finished piece is never redone): ``train``
every (arm, seed) run; ``evaluate`` every model on the study's test prompts (``eval/``) and the base model and
``hard_arms`` on the harder pass@k prompts (``eval_hard/``); ``report`` (``short_answers_cure_results``). ``--rerun LABEL`` trains one recorded run
again in a scratch folder and says whether it came back bit for bit (exit status 1 if not).

    python -m setpo_lab run short_answers_cure --preset pilot --out results/short_answers/pilot
    python -m setpo_lab run short_answers_cure --preset cure --out results/short_answers/cure
    python -m setpo_lab run short_answers_cure --preset cure --out results/short_answers/cure --rerun key_gated_s0
"""

from __future__ import annotations

from setpo_lab.studies.arguments import StudyCommand, run_command
from setpo_lab.studies.short_answers import STAGES, run_extended
from setpo_lab.studies.short_answers_config import CureStudyConfig

#: ``python -m setpo_lab run short_answers_cure --preset cure --out DIR``
COMMAND = StudyCommand("short_answers_cure", CureStudyConfig.presets(), STAGES, run_extended, default_preset="cure",
                       fields=frozenset(CureStudyConfig.__dataclass_fields__), options=("model_path", "rerun"),
                       doc=__doc__)

if __name__ == "__main__":
    raise SystemExit(run_command(COMMAND))
