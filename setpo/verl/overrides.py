"""The verl launch config and what it becomes: the paper's presets as verl overrides, one
``VerlLaunchConfig`` turned into Hydra overrides, composed and validated by verl's own config system.
``setpo.verl.launch`` prepares the data and runs it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from setpo.presets import PAPER_RUN, PRESETS, AlgorithmPreset, get_preset
from setpo.verl.estimator import ESTIMATOR_NAME, PLUGIN_ENV, PLUGIN_MODULE, SetPOVerlSettings
from setpo.verl.trainer import PROGRESS_ENV, PROGRESS_FILE

# verl names for the base estimator when SetPO is switched off (plain GRPO/GSPO/DAPO baselines).
_VERL_BASE = {"grpo": ("grpo", True), "dr_grpo": ("grpo", False), "rloo": ("rloo", True)}
_VERL_LOSS_MODE = {"token": "vanilla", "sequence": "gspo"}
DEVICES = ("cuda", "cpu")
#: the CPU platform module (setpo.verl.cpu; imported only by CPU runs) and its rollout's name.
CPU_MODULE = "setpo.verl.cpu"
CPU_ROLLOUT = "hf"
#: where verl's file logger (``--logger ...,file``) writes a run's metrics, in the run's folder
METRICS_FILE = "metrics.jsonl"
#: the verifier verl's reward loop calls (``reward.custom_reward_function``) for each task's data.
TASK_REWARDS = {"math": "pkg://setpo.envs.math", "countdown": "pkg://setpo.envs.countdown"}


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    s = str(v)
    # Hydra's override grammar: quote anything beyond a plain token (paths with '=' or spaces, commas...)
    if s == "" or any(c in s for c in " ,=[]{}()'\":\\$*?"):
        return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return s


def verl_preset_overrides(preset: AlgorithmPreset | str) -> list[str]:
    """Hydra overrides that realise a preset's policy loss in verl's actor (values from setpo.presets)."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    if p.ratio_level not in _VERL_LOSS_MODE:
        raise ValueError(f"preset {p.name!r}: ratio_level {p.ratio_level!r} has no verl loss_mode")
    actor = "actor_rollout_ref.actor"
    return [
        f"{actor}.policy_loss.loss_mode={_VERL_LOSS_MODE[p.ratio_level]}",
        f"{actor}.clip_ratio={p.clip_low!r}",
        f"{actor}.clip_ratio_low={p.clip_low!r}",
        f"{actor}.clip_ratio_high={p.clip_high!r}",
        f"{actor}.loss_agg_mode={p.loss_agg}",
        f"{actor}.optim.lr={p.lr!r}",
        f"algorithm.filter_groups.enable={_fmt(p.dynamic_sampling)}",
    ]


#: Workers per node with ``--device cpu`` when ``--n-gpus-per-node`` is not given.
CPU_WORKERS_PER_NODE = 2


def _option(help: str, *, flag: str | None = None, choices=None, cli_default=MISSING) -> dict[str, Any]:
    """A ``VerlLaunchConfig`` field's metadata that makes it an option of ``python -m setpo.verl train``
    (``build_parser``): its help text, and where the command line differs from the field: the flag (default
    --field-name), the choices, and a default of the command line's own (``launch_config_from_args`` turns it
    into the field's value)."""
    return {"help": help, "flag": flag, "choices": choices, "cli_default": cli_default}


@dataclass
class VerlLaunchConfig:
    """Everything ``scripts/run_setpo.sh`` sets; defaults are the paper's math settings (docs/studies/math.md).

    model_path: base model directory (MODEL_PATH). train_files / val_files: data files (TRAIN_FILE,
    VAL_FILE; verl parquet, or raw GSM8K/MATH-style files, converted by ``prepare_data``).
    embedding_model: EMBEDDING_MODEL_PATH, or "default" / "hash" (see ``SetPOVerlSettings``).
    algo: a key of ``setpo.presets.PRESETS`` (ALGO). lam: λ (SETPO_LAMBDA; None: the preset's).
    setpo: False runs the plain base algorithm (verl's own estimator) for the baseline.
    nnodes, n_gpus_per_node: cluster shape (NNODES, N_GPUS_PER_NODE); on the CPU, workers per node.
    rollout_n (G), temperature, max_response_length, kl_coef, train_batch_size (prompts per step),
    total_epochs: the paper's (``setpo.presets.PAPER_RUN``: 6, 0.9, 756, 1e-4, 64, 2). max_prompt_length:
    **design choice**, 512 covers GSM8K/MATH prompts with the template. ppo_mini_batch_size =
    train_batch_size: one on-policy update per step (**design choice**; the paper gives only the global batch).
    val_n, val_temperature, val_top_p: Pass@1 as avg@k at T=0.5, top-p 0.9 (PAPER_RUN: k = 64).
    device: "cuda" (vLLM rollouts) or "cpu" (``setpo.verl.cpu``: FSDP2 over gloo, transformers rollouts).
    task: "math" (``setpo.envs.math`` verifier) or "countdown" (``setpo.envs.countdown`` verifier). total_training_steps:
    stop after this many steps (None: verl's, from the epochs).
    rollout_tp, gpu_memory_utilization, micro_batch_per_gpu: engine sizing, not science.
    ray_address: an existing Ray cluster to run on (``--ray-address``, else ``RAY_ADDRESS``, which ``ray job
    submit`` sets for its entrypoint); None: ``ray.init`` starts a local one. With an address, Ray's resources
    are the cluster's (``ray start --num-gpus ...`` on each node), so no ``ray_init`` resource is passed:
    ``ray.init(address=...)`` refuses ``num_cpus`` / ``num_gpus``.
    """

    model_path: str = field(metadata=_option("local base model directory (MODEL_PATH)"))
    train_files: list[str] = field(metadata=_option(
        "training data (TRAIN_FILE): verl parquet or raw GSM8K/MATH parquet/jsonl; comma-separated list allowed",
        flag="--train-file"))
    val_files: list[str] = field(metadata=_option("validation data (VAL_FILE), as --train-file", flag="--val-file"))
    embedding_model: str = field(default="default", metadata=_option(
        "local sentence-transformers dir (paper: Qwen3-Embedding-0.6B), 'default' or 'hash'"))
    algo: str = field(default="grpo", metadata=_option(
        "preset from setpo.presets: loss mode, clip, lr, λ (default: %(default)s)", choices=sorted(PRESETS)))
    lam: float | None = field(default=None, metadata=_option("λ (default: the preset's)"))
    setpo: bool = field(default=True, metadata=_option("plain base algorithm (baseline run)", flag="--no-setpo"))
    nnodes: int = field(default=1, metadata=_option("nodes in the Ray cluster (default: %(default)s)"))
    n_gpus_per_node: int = field(default=8, metadata=_option(
        f"GPUs per node; with --device cpu, FSDP workers per node (default: 8, cpu: {CPU_WORKERS_PER_NODE})",
        cli_default=None))
    rollout_n: int = field(default=PAPER_RUN.num_generations,
                           metadata=_option("rollouts per prompt, G (default: %(default)s)"))
    temperature: float = PAPER_RUN.temperature
    max_prompt_length: int = field(default=512, metadata=_option("prompt tokens (default: %(default)s)"))
    max_response_length: int = field(default=PAPER_RUN.max_completion_length,
                                     metadata=_option("response tokens (default: %(default)s)"))
    kl_coef: float = field(default=PAPER_RUN.beta, metadata=_option(
        "KL coefficient β; 0 turns the KL loss off and with it verl's reference model (default: %(default)s)"))
    train_batch_size: int = field(default=PAPER_RUN.prompts_per_step,
                                  metadata=_option("prompts per step (default: %(default)s)"))
    ppo_mini_batch_size: int | None = None
    total_epochs: int = field(default=PAPER_RUN.num_train_epochs,
                              metadata=_option("passes over the training data (default: %(default)s)"))
    val_n: int = field(default=PAPER_RUN.eval_k,
                       metadata=_option("samples per validation prompt; Pass@1 = avg@N (default: %(default)s)"))
    val_temperature: float = PAPER_RUN.eval_temperature
    val_top_p: float = PAPER_RUN.eval_top_p
    test_freq: int = field(default=20, metadata=_option("validate every N steps (default: %(default)s)"))
    save_freq: int = field(default=50, metadata=_option(
        "checkpoint every N steps; a rerun resumes from the last (default: %(default)s)"))
    rollout_name: str = "vllm"
    rollout_tp: int = field(default=1, metadata=_option("vLLM tensor-parallel size (default: %(default)s)"))
    gpu_memory_utilization: float = field(default=0.6,
                                          metadata=_option("vLLM's share of GPU memory (default: %(default)s)"))
    micro_batch_per_gpu: int = field(default=8, metadata=_option(
        "sequences per GPU per forward/backward pass (default: %(default)s)"))
    embedding_device: str = field(default="auto", metadata=_option(
        "where the SetPO embedder runs: auto (a GPU when visible), cuda or cpu"))
    embedding_batch_size: int = 64
    project_name: str = "setpo"
    experiment_name: str | None = field(default=None,
                                        metadata=_option("run name (default: from the algorithm and λ)"))
    output_dir: str = field(default="runs/verl", metadata=_option(
        "checkpoints and overrides.txt go under OUTPUT_DIR/<experiment> (default: %(default)s)"))
    logger: tuple[str, ...] = field(default=("console",), metadata=_option(
        "comma-separated, e.g. console,wandb", cli_default="console"))
    device: str = field(default="cuda", metadata=_option(
        "cuda: vLLM rollouts on GPUs; cpu: verl's trainer on the CPU (setpo.verl.cpu: FSDP2 over gloo, "
        "transformers rollouts), for laptops and CI (default: %(default)s)", choices=DEVICES))
    task: str = field(default="math", metadata=_option(
        "which verifier scores the responses: math (setpo.envs.math) or countdown (setpo.envs.countdown) "
        "(default: %(default)s)", choices=sorted(TASK_REWARDS)))
    total_training_steps: int | None = field(default=None, metadata=_option(
        "stop after this many training steps (default: all epochs)", flag="--total-steps"))
    seed: int = field(default=0, metadata=_option("data shuffling seed (default: %(default)s)"))
    tokenizer_path: str | None = field(default=None, metadata=_option(
        "local tokenizer directory, when not the model's (default: --model-path)"))
    ray_address: str | None = field(default=None, metadata=_option(
        "join this running Ray cluster (host:port of its head, as `ray start --head` prints) instead of starting "
        "one (default: $RAY_ADDRESS, which `ray job submit` sets; else a local cluster)"))

    def __post_init__(self):
        get_preset(self.algo)
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {list(DEVICES)}, got {self.device!r}")
        if self.task not in TASK_REWARDS:
            raise ValueError(f"task must be one of {sorted(TASK_REWARDS)}, got {self.task!r}")
        if self.total_training_steps is not None and self.total_training_steps < 1:
            raise ValueError(f"total_training_steps must be >= 1, got {self.total_training_steps}")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0 (0: no KL loss, no reference model), got {self.kl_coef!r}")
        if self.rollout_n < 3 and self.setpo:
            raise ValueError(f"SetPO needs at least 3 rollouts per prompt (rollout_n), got {self.rollout_n}")
        for name in ("nnodes", "n_gpus_per_node", "rollout_n", "train_batch_size", "total_epochs", "val_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.train_files or not self.val_files:
            raise ValueError("need at least one train file and one val file")
        if self.device == "cpu" and self.nnodes > 1 and not self.ray_address:
            raise ValueError(f"--device cpu with --nnodes {self.nnodes} needs a running Ray cluster: start one with "
                             "`ray start` on each node and pass --ray-address (or submit with `ray job submit`)")

    @property
    def preset(self) -> AlgorithmPreset:
        return get_preset(self.algo)

    @property
    def lam_value(self) -> float:
        return self.preset.lam if self.lam is None else float(self.lam)

    @property
    def run_name(self) -> str:
        if self.experiment_name:
            return self.experiment_name
        return f"{'setpo_' if self.setpo else ''}{self.algo}" + (f"_lam{self.lam_value:g}" if self.setpo else "")


def build_overrides(cfg: VerlLaunchConfig) -> list[str]:
    """Hydra overrides of verl's ``ppo_trainer`` config for one run (no file access; see ``prepare_data``)."""
    p = cfg.preset
    ar = "actor_rollout_ref"
    out_dir = Path(cfg.output_dir) / cfg.run_name
    o = [
        f"data.train_files={_fmt(list(cfg.train_files))}",
        f"data.val_files={_fmt(list(cfg.val_files))}",
        f"data.train_batch_size={cfg.train_batch_size}",
        f"data.max_prompt_length={cfg.max_prompt_length}",
        f"data.max_response_length={cfg.max_response_length}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"{ar}.model.path={_fmt(cfg.model_path)}",
        *([f"{ar}.model.tokenizer_path={_fmt(cfg.tokenizer_path)}"] if cfg.tokenizer_path else []),
        f"{ar}.model.use_remove_padding={_fmt(cfg.device != 'cpu')}",
        f"{ar}.model.enable_gradient_checkpointing={_fmt(cfg.device != 'cpu')}",
        f"{ar}.actor.ppo_mini_batch_size={cfg.ppo_mini_batch_size or cfg.train_batch_size}",
        f"{ar}.actor.ppo_micro_batch_size_per_gpu={cfg.micro_batch_per_gpu}",
        f"{ar}.actor.use_kl_loss={_fmt(cfg.kl_coef != 0)}",  # β = 0: verl then builds no reference model
        f"{ar}.actor.kl_loss_coef={cfg.kl_coef!r}",
        f"{ar}.actor.kl_loss_type=low_var_kl",  # verl's k3 estimator
        f"{ar}.actor.entropy_coeff=0",
        f"{ar}.actor.optim.lr_scheduler_type=constant",
        f"{ar}.actor.optim.lr_warmup_steps=0",
        *verl_preset_overrides(p),
        f"{ar}.rollout.name={CPU_ROLLOUT if cfg.device == 'cpu' else cfg.rollout_name}",
        f"{ar}.rollout.n={cfg.rollout_n}",
        f"{ar}.rollout.temperature={cfg.temperature!r}",
        f"{ar}.rollout.tensor_model_parallel_size={cfg.rollout_tp}",
        f"{ar}.rollout.gpu_memory_utilization={cfg.gpu_memory_utilization!r}",
        f"{ar}.rollout.log_prob_micro_batch_size_per_gpu={2 * cfg.micro_batch_per_gpu}",
        f"{ar}.rollout.val_kwargs.n={cfg.val_n}",
        f"{ar}.rollout.val_kwargs.temperature={cfg.val_temperature!r}",
        f"{ar}.rollout.val_kwargs.top_p={cfg.val_top_p!r}",
        f"{ar}.rollout.val_kwargs.do_sample=true",
        f"{ar}.ref.log_prob_micro_batch_size_per_gpu={2 * cfg.micro_batch_per_gpu}",
        "algorithm.use_kl_in_reward=false",
        "critic.enable=false",  # group-relative estimators need no critic; saying so also keeps verl quiet about it
        f"reward.custom_reward_function.path={_fmt(TASK_REWARDS[cfg.task])}",
        "reward.custom_reward_function.name=verl_compute_score",
        f"trainer.nnodes={cfg.nnodes}",
        f"trainer.n_gpus_per_node={cfg.n_gpus_per_node}",
        f"trainer.total_epochs={cfg.total_epochs}",
        f"trainer.test_freq={cfg.test_freq}",
        f"trainer.save_freq={cfg.save_freq}",
        "trainer.val_before_train=true",
        "trainer.resume_mode=auto",
        "trainer.use_v1=true",
        f"trainer.project_name={_fmt(cfg.project_name)}",
        f"trainer.experiment_name={_fmt(cfg.run_name)}",
        f"trainer.default_local_dir={_fmt(str(out_dir / 'checkpoints'))}",
        f"trainer.logger={_fmt(list(cfg.logger))}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{PLUGIN_ENV}={_fmt(plugin_modules(cfg.device))}",
        f"data.seed={cfg.seed}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{PROGRESS_ENV}={_fmt(str(out_dir / PROGRESS_FILE))}",
    ]
    if "file" in cfg.logger:  # verl's file logger: the run's metrics as JSON lines in its folder
        o.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={_fmt(str(out_dir / METRICS_FILE))}")
    if cfg.total_training_steps is not None:
        o.append(f"trainer.total_training_steps={cfg.total_training_steps}")
    if cfg.device == "cpu":
        o += cpu_overrides(cfg.n_gpus_per_node, local_ray=not cfg.ray_address)
    if cfg.tokenizer_path and cfg.device != "cpu" and cfg.rollout_name == "vllm":
        # vLLM loads its tokenizer from the model folder unless told otherwise (verl passes engine_kwargs on)
        o.append(f"+{ar}.rollout.engine_kwargs.vllm.tokenizer={_fmt(cfg.tokenizer_path)}")
    if cfg.ray_address:  # the one place a run joins an existing cluster (resources are then the cluster's)
        o.append(f"+ray_kwargs.ray_init.address={_fmt(cfg.ray_address)}")
    if cfg.setpo:
        s = "+algorithm.setpo"
        o += [
            f"algorithm.adv_estimator={ESTIMATOR_NAME}",
            f"{s}.lam={cfg.lam_value!r}",
            f"{s}.estimator={p.estimator}",
            f"{s}.embedding_model={_fmt(cfg.embedding_model)}",
            f"{s}.embedding_device={cfg.embedding_device}",
            f"{s}.embedding_batch_size={cfg.embedding_batch_size}",
        ]
    else:
        name, by_std = _VERL_BASE[p.estimator]
        o += [f"algorithm.adv_estimator={name}", f"algorithm.norm_adv_by_std_in_grpo={_fmt(by_std)}"]
    return o


def check_batch_split(cfg: VerlLaunchConfig) -> None:
    """The step's responses must split evenly over the workers and then into verl's micro batches (verl asserts
    it inside a Ray worker, minutes into a run; here it is one line before anything starts): each worker gets
    train_batch_size x rollout_n / (nnodes x n_gpus_per_node) responses, a multiple of micro_batch_per_gpu
    (the update) and of 2 x micro_batch_per_gpu (the log-probability passes, ``build_overrides``)."""
    workers = cfg.nnodes * cfg.n_gpus_per_node
    responses = cfg.train_batch_size * cfg.rollout_n
    per_worker, left = divmod(responses, workers)
    log_prob_micro = 2 * cfg.micro_batch_per_gpu
    if left or per_worker % log_prob_micro:
        raise ValueError(f"{cfg.train_batch_size} prompts x {cfg.rollout_n} rollouts = {responses} responses a step "
                         f"over {workers} workers must give each a multiple of {log_prob_micro} (2 x "
                         f"micro_batch_per_gpu {cfg.micro_batch_per_gpu}); change --train-batch-size, --rollout-n "
                         f"or --micro-batch-per-gpu")


def plugin_modules(device: str = "cuda") -> str:
    """What ``VERL_USE_EXTERNAL_MODULES`` names in every Ray worker: the plug-in, and on the CPU its platform."""
    return PLUGIN_MODULE + (f",{CPU_MODULE}" if device == "cpu" else "")


def cpu_overrides(workers: int, local_ray: bool = True) -> list[str]:
    """verl settings of a CPU run (``setpo.verl.cpu``): the platform in every worker, ``workers`` logical Ray
    GPUs (one per FSDP2 worker over gloo), transformers rollouts, sdpa attention, float32, no torch compile.

    local_ray False: the run joins a running cluster, whose nodes declare their logical GPUs themselves
    (``ray start --num-gpus <workers per node>``); ``ray.init`` then takes no resource settings."""
    ar = "actor_rollout_ref"
    local = [
        f"+ray_kwargs.ray_init.num_gpus={workers}",
        f"ray_kwargs.ray_init.num_cpus={4 * workers + 8}",  # logical: verl's bundles ask 3 CPUs per worker
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]
    out = [
        "trainer.device=cpu",
        *(local if local_ray else []),
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu",
        "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='1'",
        "+ray_kwargs.ray_init.runtime_env.env_vars.MKL_NUM_THREADS='1'",
        f"+{ar}.model.override_config.attn_implementation=sdpa",
        f"{ar}.rollout.tensor_model_parallel_size=1",
        f"{ar}.rollout.free_cache_engine=false",
        f"{ar}.rollout.enforce_eager=true",
        # one process each where verl starts eight by default: every Ray process imports verl (~20 s of CPU)
        f"{ar}.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    for role in ("actor", "ref"):
        out += [
            f"{ar}.{role}.strategy=fsdp2",
            f"{ar}.{role}.use_torch_compile=false",
            f"{ar}.{role}.fsdp_config.use_torch_compile=false",
            f"+{ar}.{role}.fsdp_config.mixed_precision.param_dtype=fp32",
            f"+{ar}.{role}.fsdp_config.mixed_precision.reduce_dtype=fp32",
            f"+{ar}.{role}.fsdp_config.mixed_precision.buffer_dtype=fp32",
        ]
    return out


def verl_config_dir() -> Path:
    """verl's packaged Hydra config directory (holds ppo_trainer.yaml)."""
    import verl.trainer

    return Path(verl.trainer.__file__).resolve().parent / "config"


def compose_config(overrides: Sequence[str], config_name: str = "ppo_trainer"):
    """verl's config with ``overrides`` applied, composed by Hydra exactly as ``verl.trainer.main_ppo`` does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def validate(config) -> None:
    """verl's own checks (``verl.utils.config.validate_config``) plus ours for the setpo section."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if config.algorithm.adv_estimator == ESTIMATOR_NAME:
        SetPOVerlSettings.from_algorithm_config(config.algorithm)
        if not config.trainer.use_v1:
            raise ValueError("the setpo verl plug-in embeds responses in the v1 trainer; set trainer.use_v1=true")

