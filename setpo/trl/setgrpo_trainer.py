"""SetGRPO on TRL: a ``GRPOTrainer`` whose two reward functions are the two graders and whose advantages are
SetGRPO's calibrated coefficients (``setpo.setgrpo``)."""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from setpo.groups import check_int
from setpo.setgrpo import SetGRPO, SetGRPOConfig, SetGRPOOutput, lm_head_gradient_features, reference_coefficients
from setpo.setgrpo.inputs import check_feature_dims
from setpo.trl.trainer import gather_embeddings


class SetGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose advantages are SetGRPO coefficients; its two reward functions are the
    two graders (each response's two scores are ``rewards_per_func``'s two columns, before weights).

    Extra keywords: ``setgrpo`` (a ``SetGRPOConfig``; ``recalibrate_every`` counts training generation
    batches), ``calibration_groups`` (groups collected, with ``n_regrades`` re-gradings each, before a
    (re)calibration), ``feature_dims`` and ``feature_seed`` (``lm_head_gradient_features``; None = exact,
    tiny models only), ``embedder`` (texts -> (N, d); needed when ``setgrpo.lam`` > 0, for SetPO's term).

    Per training generation batch: TRL generates and scores as usual, then this trainer
    (1) computes the responses' gradient features with one extra no-grad forward pass of the policy
    (the paper's "Jacobian" cost), gathered over processes like TRL's rewards;
    (2) while a calibration is being collected, re-grades the batch ``n_regrades`` times by calling the
    reward functions again (reference = group advantage of the mean of all gradings) and stores it;
    once ``calibration_groups`` groups are stored and ``recalibrate_every`` batches have passed since
    the last calibration, calibrates and empties the store;
    (3) replaces TRL's advantages by the SetGRPO coefficients of this process's rows. Until the first
    calibration there is nothing to gate with, and TRL's own GRPO advantages are kept (a warm-up,
    logged as ``setgrpo/calibrated`` = 0). Calibration batches are also trained on: their groups only
    calibrate later batches, so exchangeability with the groups they gate is kept (up to drift).
    Eval batches keep TRL's advantages. Metrics: ``setgrpo/accepted_ratio``, ``mean_recovery_ratio``,
    ``coef_norm``, ``tau``, ``q``, ``calibrated``.
    """

    def __init__(self, *args, setgrpo: SetGRPOConfig | None = None, calibration_groups: int = 64,
                 n_regrades: int = 1, feature_dims: tuple[int, int] | None = (16, 16), feature_seed: int = 0,
                 embedder=None, **kwargs):
        # SetGRPO's own arguments are checked before TRL builds anything, so a bad one costs no model set-up and
        # never surfaces mid-training (the features are first computed after the first generation)
        if setgrpo is not None and not isinstance(setgrpo, SetGRPOConfig):
            raise ValueError(f"setgrpo must be a SetGRPOConfig, got {type(setgrpo).__name__}")
        n_regrades = check_int(n_regrades, "n_regrades", minimum=1)
        calibration_groups = check_int(calibration_groups, "calibration_groups", minimum=2)
        feature_dims = check_feature_dims(feature_dims, "feature_dims")
        feature_seed = check_int(feature_seed, "feature_seed", minimum=0)
        if embedder is not None and not callable(embedder):
            raise ValueError(f"embedder must be callable (texts -> (N, d)), got {type(embedder).__name__}")
        if (setgrpo or SetGRPOConfig()).lam > 0 and embedder is None:
            raise ValueError("setgrpo.lam > 0 needs an embedder (texts -> (N, d)) for SetPO's diversity term")
        super().__init__(*args, **kwargs)
        if len(self.reward_funcs) != 2:
            raise ValueError(f"SetGRPOTrainer needs exactly two reward functions, the two graders; got "
                             f"{len(self.reward_funcs)}")
        self.setgrpo = SetGRPO(setgrpo or SetGRPOConfig())
        self.calibration_groups, self.n_regrades = calibration_groups, n_regrades
        self.feature_dims, self.feature_seed, self.embedder = feature_dims, feature_seed, embedder
        self._store: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._stash = None
        self._train_batches = 0
        self.last_setgrpo: SetGRPOOutput | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._stash is None:  # the first call of a batch is TRL's grading; later ones are re-gradings
            self._stash = (inputs, prompts, completions, completion_ids_list, rewards)
        return rewards

    @torch.no_grad()
    def _gradient_features(self, output) -> torch.Tensor:
        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        ids = torch.cat([prompt_ids, completion_ids], 1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
        mask = output["completion_mask"]
        start, step = prompt_ids.shape[1] - 1, self.args.per_device_train_batch_size
        feats = []
        for i in range(0, ids.shape[0], step):
            out = self.model(input_ids=ids[i:i + step], attention_mask=attention[i:i + step],
                             output_hidden_states=True)
            sl = slice(start, start + completion_ids.shape[1])
            m = mask[i:i + step].clone()
            m[m.sum(-1) == 0, 0] = 1  # an empty completion still needs a token to be defined
            feats.append(lm_head_gradient_features(
                out.hidden_states[-1][:, sl], out.logits[:, sl], completion_ids[i:i + step], m,
                dims=self.feature_dims, seed=self.feature_seed, temperature=self.temperature))
        return torch.cat(feats)

    def _generate_and_score_completions(self, inputs):
        self._stash = None
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return output
        if self._stash is None:
            raise RuntimeError("SetGRPOTrainer: TRL did not score completions through _calculate_rewards; "
                               "this TRL version is not supported")
        batch_inputs, prompts, completions, ids_list, scores = self._stash
        g = self.num_generations
        device = self.accelerator.device
        feats = self.accelerator.gather(self._gradient_features(output).to(device))     # (N_all, k)
        sg, cfg = self.setgrpo, self.setgrpo.config
        if sg.needs_calibration(self._train_batches) or self._store:
            regrades = [scores] + [self._calculate_rewards(batch_inputs, prompts, completions, ids_list)
                                   for _ in range(self.n_regrades)]
            ref = reference_coefficients(torch.stack(regrades).double().cpu(), group_size=g)
            self._store.append((scores.double().cpu(), ref, feats.float().cpu()))
            if sum(s.shape[0] for s, _, _ in self._store) >= self.calibration_groups * g:
                cat = lambda k: torch.cat([x[k] for x in self._store])  # noqa: E731
                sg.calibrate(cat(0), cat(1), cat(2), group_size=g, step=self._train_batches)
                self._store = []
        metrics = self._metrics["train"]
        metrics["setgrpo/calibrated"].append(float(sg.calibration is not None))
        self._train_batches += 1
        if sg.calibration is None:
            return output
        emb = None
        if cfg.lam > 0:  # every process's rows, like scores and feats: groups may span processes
            emb = gather_embeddings(self.accelerator, self.embedder, completions)[0].float().cpu()
        out = sg.coefficients(scores.double().cpu(), feats.float().cpu(), group_size=g, emb=emb)
        n_local = output["advantages"].shape[0]
        pi = self.accelerator.process_index
        output["advantages"] = out.coef[pi * n_local:(pi + 1) * n_local].to(output["advantages"])
        self.last_setgrpo = out
        for name, value in (("accepted_ratio", out.accepted_ratio), ("mean_recovery_ratio",
                            out.mean_recovery_ratio), ("coef_norm", out.coef_norm), ("tau", out.tau),
                            ("q", out.q)):
            metrics[f"setgrpo/{name}"].append(float(value))
        return output
