"""A study command's arguments, checked before any work: ``--stages`` and ``--set FIELD=JSON``, with one-line
errors and exit status 2. The parser and the number types every command shares are ``setpo.envs.arguments``'s."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from setpo_lab.studies.stages import STAGE_NAMES, chosen_stages


def add_stage_and_set_arguments(p: argparse.ArgumentParser, stages: Sequence[str], set_example: str,
                                stages_note: str = "default: all") -> None:
    """A study command's ``--stages`` (comma-separated, of ``stages``) and ``--set FIELD=JSON ...`` options."""
    p.add_argument("--stages", default=",".join(stages),
                   help=f"comma-separated stages to run, of {','.join(stages)} ({stages_note})")
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar="FIELD=JSON",
                   help=f"override config fields, e.g. --set {set_example}")


def parsed_stages(p: argparse.ArgumentParser, text: str, stages: Sequence[str]) -> list[str]:
    """``--stages`` checked against the study's (``stages.chosen_stages``), a one-line error otherwise."""
    try:
        return chosen_stages(text, stages)
    except ValueError as e:
        p.error(f"--stages: {e}")


def set_overrides(p: argparse.ArgumentParser, items: Sequence[str], known: Collection[str],
                  reserved: Collection[str] = (), reserved_why: str = "") -> dict:
    """``--set FIELD=VALUE`` items as config overrides: VALUE as JSON, else a bare string. A field that is
    not in ``known``, or is ``reserved`` (it has an option of its own: ``reserved_why`` says so), is a
    one-line error listing the fields that may be set."""
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            p.error(f"--set: expected FIELD=VALUE, got {item!r}")
        if key not in known or key in reserved:
            p.error(f"--set: unknown config field {key!r}{reserved_why}; known: "
                    + ", ".join(sorted(set(known) - set(reserved))))
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string
        # json reads NaN and Infinity as numbers, and "nan" stays text that a config compares with a number: no
        # study setting is infinite or NaN, so either is refused here, naming the field
        if not _finite(overrides[key]) or value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            p.error(f"--set {key}: expected a finite value, got {value!r}")
    return overrides


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, dict)):
        return all(map(_finite, value.values() if isinstance(value, dict) else value))
    return True


# ---- a config's fields, checked when it is built (before a folder is claimed) -------------------------------------
def _whole(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


#: what a study config's field may be: rule -> (the words of its error, the test). Each test checks the type too
#: (True is not a count, "0.5" is not a λ), and NaN fails every comparison.
FIELD_RULES = {
    "count": ("a whole number >= 1", lambda v: _whole(v, 1)),
    "seed": ("a whole number >= 0", lambda v: _whole(v, 0)),
    "group": ("a whole number >= 3 (SetPO's leave-one-out set)", lambda v: _whole(v, 3)),
    "limit": ("a whole number >= 1, or null for none", lambda v: v is None or _whole(v, 1)),
    "positive": ("a positive finite number", _positive),
    "nonnegative": ("a finite number >= 0", lambda v: v == 0 and not isinstance(v, bool) or _positive(v)),
    "share": ("a number in [0, 1]", lambda v: v == 0 and not isinstance(v, bool) or _positive(v) and v <= 1),
    "probability": ("a number in (0, 1]", lambda v: _positive(v) and v <= 1),
    "positives": ("positive finite numbers, at least one",
                  lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(map(_positive, v))),
    "seeds": ("distinct whole numbers >= 0, at least one", lambda v: isinstance(v, (list, tuple)) and len(v) > 0
              and all(_whole(s, 0) for s in v) and len(set(v)) == len(v)),
    "flag": ("true or false", lambda v: isinstance(v, bool)),
}


def check_fields(config, **rules: Sequence[str]) -> None:
    """A ValueError naming the first field of ``config`` (a study's config dataclass) that breaks its rule:
    ``rules`` maps a rule of ``FIELD_RULES`` to the fields it governs, e.g. ``check_fields(self, count=("steps",),
    positive=("lr",))``. Every study's config calls it in ``__post_init__``, so a bad ``--set`` is refused before
    any work, and the rerun with it fixed is not refused as another configuration's folder."""
    for rule, names in rules.items():
        what, ok = FIELD_RULES[rule]
        for name in names:
            if not ok(getattr(config, name)):
                raise ValueError(f"{name} must be {what}, got {getattr(config, name)!r}")


# ---- the one study command: python -m setpo_lab run STUDY --preset ... --out ... --stages ... --set ... ----------
#: options a study may take beyond --preset, --out, --stages and --set: name -> (flags, argparse keywords)
STUDY_OPTIONS = {
    "model_path": (("--model-path",), {"default": None, "help": "a local model folder (default: the study's)"}),
    "rerun": (("--rerun",), {"default": None, "metavar": "LABEL", "help": "train one recorded run again in a "
                             "scratch folder and compare it with the record (weights and every logged step), "
                             "instead of running the stages"}),
    "redo": (("--redo",), {"action": "store_true", "help": "remake what was made at another thread count, code or "
                           "package versions (refused otherwise)"}),
    "figures": (("--figures",), {"default": None, "metavar": "DIR", "help": "also write the report's figures here"}),
    "config": (("--config",), {"default": None, "metavar": "RUN_CONFIG", "help": "start from a finished run's "
                               "saved config instead of a preset (e.g. to judge it)"}),
}


@dataclass(frozen=True)
class StudyCommand:
    """What a study's command line differs in; ``study_parser`` makes the one parser every study shares from it.

    ``presets``: name -> config factory taking config fields as keywords (``--preset NAME``, or ``--NAME``);
    ``folder``: the config field ``--out`` sets (None: the folder goes to ``run`` as ``args.out``); ``writes``
    False: the study writes nothing (no ``--out``);
    ``default_out``: a preset's folder when ``--out`` is not given (a preset not named here needs ``--out``);
    ``fields``: the config fields ``--set`` may change; ``options``: of ``STUDY_OPTIONS``, plus "judge" (the
    LLM judge's options, ``judging``); ``pinned``: presets that must run on the pinned floating-point path
    (``setpo_lab.repro.arithmetic``: a study made across sittings); ``saved``: reads ``--config FILE`` into
    config fields, which the first preset's factory builds; ``run(cfg, stages, args)``: the study, returning the
    exit status (``args.out`` the folder, ``args.argv`` the command line as given). ``stages``: those of
    ``stages.STAGE_NAMES`` the study has, in that order (every study names its stages alike)."""

    name: str
    presets: Mapping[str, Callable]
    stages: Sequence[str]
    run: Callable[..., int]
    default_preset: str | None = None
    folder: str | None = "run_dir"
    default_out: Mapping[str, str] = field(default_factory=dict)
    fields: Collection[str] = ()
    options: Collection[str] = ()
    pinned: Collection[str] = ()
    saved: Callable[[Path], dict] | None = None
    writes: bool = True
    doc: str = ""

    def __post_init__(self):
        if not self.stages or list(self.stages) != [s for s in STAGE_NAMES if s in self.stages]:
            raise ValueError(f"study {self.name!r}: stages {tuple(self.stages)} must be some of {STAGE_NAMES}, in that "
                             "order (every study names its stages alike)")

    @property
    def prog(self) -> str:
        return f"python -m setpo_lab run {self.name}"


def study_parser(command: StudyCommand) -> argparse.ArgumentParser:
    """The one parser of the study commands: ``--preset`` (each preset also as ``--NAME``), ``--out``, ``--stages``,
    ``--set FIELD=JSON`` and the study's ``options``."""
    from setpo.envs.arguments import Parser

    p = Parser(prog=command.prog, description=command.doc.split("\n\n")[0])
    presets = p.add_mutually_exclusive_group()
    presets.add_argument("--preset", choices=list(command.presets), default=None,
                         help=f"default: {command.default_preset}" if command.default_preset else "required")
    for name in command.presets:
        presets.add_argument(f"--{name}", dest="preset", action="store_const", const=name, help=f"--preset {name}")
    if command.writes:
        p.add_argument("--out", "--run-dir", dest="out", default=None,
                       help="the study's folder" + "".join(f"; {k}: {v}" for k, v in command.default_out.items()))
    add_stage_and_set_arguments(p, command.stages, "FIELD=VALUE" if command.fields else "(this study has none)")
    for option in command.options:
        if option == "judge":
            from setpo_lab.studies import judging

            judging.add_judge_arguments(p)
        else:
            flags, kwargs = STUDY_OPTIONS[option]
            p.add_argument(*flags, **kwargs)
    return p


def parse_study_args(command: StudyCommand, argv: Sequence[str] | None = None):
    """(config, stages, args) from a command line, every value checked before any work starts (a bad one: one
    line on stderr, exit status 2)."""
    p = study_parser(command)
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    stages = parsed_stages(p, a.stages, command.stages)
    preset = a.preset or command.default_preset
    overrides = {}
    if getattr(a, "config", None):
        if a.preset:
            p.error("give either --config or a preset, not both")
        try:
            overrides = command.saved(Path(a.config))
        except (OSError, ValueError) as e:
            p.error(f"--config {a.config}: {e}")
        preset = next(iter(command.presets))  # the first preset's factory builds a saved config
    elif preset is None:
        p.error(f"give a preset: --preset {{{','.join(command.presets)}}}")
    reserved = {command.folder} if command.folder else set()
    if "judge" in command.options:
        from setpo_lab.studies import judging

        reserved |= set(judging.JUDGE_FIELDS)
    overrides.update(set_overrides(p, a.set, command.fields, reserved, " (it has its own option)"))
    if "judge" in command.options:
        overrides.update(judging.judge_overrides(a, p, stages))
    if "model_path" in command.options and a.model_path is not None:
        overrides["model_path"] = a.model_path
    if command.writes:
        a.out = a.out or overrides.get(command.folder) or command.default_out.get(preset)
        if a.out is None:
            p.error(f"--out is required with --preset {preset} (the study's folder)")
        if command.folder:
            overrides[command.folder] = a.out
    try:
        cfg = command.presets[preset](**overrides)
        if preset in command.pinned:
            from setpo_lab.repro.arithmetic import require_pinned

            require_pinned(f"{command.prog} --preset {preset}")
    except ValueError as e:
        p.error(str(e))
    except TypeError as e:  # a value of another type than its field's, compared or added in the config's check
        named = ", ".join(item.partition("=")[0] for item in a.set)
        p.error(f"{e}" + (f" (a value of the wrong type? --set {named})" if named else ""))
    return cfg, stages, a


def run_command(command: StudyCommand, argv: Sequence[str] | None = None) -> int:
    """A study from its command line: the arguments parsed once, then ``command.run``. A refusal (another config's
    folder, a stage not run, a judge down: a ValueError) is one line on stderr and exit status 1."""
    cfg, stages, args = parse_study_args(command, argv)
    try:
        return command.run(cfg, stages, args)
    except ValueError as err:
        print(f"{command.prog}: error: {err}", file=sys.stderr)
        return 1


def flags_as_set(argv: Sequence[str], flags: Collection[str]) -> list[str]:
    """A recorded command line of a study's older parser, for the one parser: each ``--flag VALUE`` of ``flags``
    becomes ``--set flag=VALUE`` (dashes as underscores); everything else is kept as it is."""
    argv, out, i = list(argv), [], 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv):
            out += ["--set", f"{argv[i][2:].replace('-', '_')}={argv[i + 1]}"]
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out
