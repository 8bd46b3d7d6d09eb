"""What every verl process of a setpo install loads: the ``verl.plugins`` entry point (``pyproject.toml``).

verl imports every entry point of the group ``verl.plugins`` at the end of ``import verl``
(``verl/__init__.py``, unless ``VERL_USE_EXTERNAL_PLUGINS=none``), in every process (driver, Ray task runner,
FSDP workers, rollout servers), so a guard installed here reaches all of them, in any install that has setpo,
with nothing to set. It must stay light (it runs inside ``import verl``): no torch, no transformers, no
``setpo.verl`` (whose estimator imports verl's trainer).

The TRL guard
-------------
verl 0.9.1's ``apply_monkey_patch`` (``verl/models/transformers/monkey_patch.py``), which its FSDP engine calls on
every model build (``verl/workers/engine/fsdp/transformer_impl.py``), imports TRL's
``AutoModelForCausalLMWithValueHead`` whenever ``verl.utils.import_utils.is_trl_available()`` says TRL is
installed, only to patch that class's ``state_dict``. TRL removed the class in 1.13 (it lived in
``trl.experimental.ppo`` up to 1.12); setpo's TRL trainers need TRL 1.16, so in setpo's installs every verl model
build raised ImportError. verl's only other caller of ``is_trl_available`` (``verl.utils.model.
load_valuehead_model``) also wants exactly that class. So, for the verl version checked here, ``is_trl_available``
is replaced by "TRL is installed **and** still has the value-head model": with TRL >= 1.13 verl skips a patch of a
class that does not exist, and a value-head critic (never used by SetPO/GRPO) gets verl's own "install trl" error
instead of an ImportError. Nothing changes with TRL <= 1.12 or without TRL.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import sys

#: verl releases whose ``is_trl_available`` callers were read and need the guard (see the module docstring).
GUARDED_VERL_VERSIONS = ("0.9.1",)
#: the first TRL release without ``AutoModelForCausalLMWithValueHead``.
TRL_WITHOUT_VALUE_HEAD = (1, 13)

_log = logging.getLogger(__name__)


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version  # a dependency of verl

    return Version(version).release


def trl_has_value_head(trl_version: str | None) -> bool:
    """Whether a TRL release still ships ``AutoModelForCausalLMWithValueHead`` (None: TRL is not installed)."""
    return trl_version is not None and _release(trl_version) < TRL_WITHOUT_VALUE_HEAD


def verl_trl_clash(verl_version: str | None, trl_version: str | None) -> bool:
    """Whether this verl and TRL, with setpo installed, still break verl's model build: a TRL without the value-head
    model next to a verl that imports it and that the guard does not cover."""
    if verl_version is None or trl_version is None or trl_has_value_head(trl_version):
        return False
    return verl_version.split("+")[0] not in GUARDED_VERL_VERSIONS


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _trl_with_value_head() -> bool:
    """``is_trl_available`` as verl's value-head callers need it: TRL importable and still with the class."""
    try:
        if importlib.util.find_spec("trl") is None:
            return False
    except (ModuleNotFoundError, ValueError):
        return False
    return trl_has_value_head(_installed("trl"))


_trl_with_value_head.setpo_guard = True


def install_trl_guard() -> bool:
    """Install the TRL guard in this process (idempotent); True if verl now uses it.

    Patches ``verl.utils.import_utils.is_trl_available`` and the copies that ``from ... import`` made in the
    verl modules already imported (``monkey_patch``, ``verl.utils.model``); modules imported later copy the
    patched function. Only for the verl versions in ``GUARDED_VERL_VERSIONS``; any other verl is left alone
    (a warning says so when its TRL lacks the class).
    """
    verl_version = _installed("verl")
    if verl_version is None:
        return False
    if verl_version.split("+")[0] not in GUARDED_VERL_VERSIONS:
        if not trl_has_value_head(_installed("trl")) and _installed("trl") is not None:
            _log.warning("setpo: verl %s is untested (tested: %s); its TRL guard is not installed", verl_version,
                         ", ".join(GUARDED_VERL_VERSIONS))
        return False
    import verl.utils.import_utils as import_utils

    import_utils.is_trl_available = _trl_with_value_head
    for name in ("verl.models.transformers.monkey_patch", "verl.utils.model"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "is_trl_available"):
            module.is_trl_available = _trl_with_value_head
    return True


install_trl_guard()
