"""verl builds its models in setpo's own install: verl 0.9.1's ``apply_monkey_patch`` imports TRL's
value-head model, gone since TRL 1.13, and setpo's ``verl.plugins`` entry point (``setpo.verl_plugin``) guards it
in every process that imports verl."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the issue's snippet, as a new user runs it: nothing from setpo imported, no environment variable set
SNIPPET = textwrap.dedent("""
    from transformers import Qwen2Config, AutoModelForCausalLM
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    m = AutoModelForCausalLM.from_config(Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=128, vocab_size=256))
    apply_monkey_patch(model=m, use_remove_padding=False, ulysses_sp_size=1)
    import sys
    print("guarded:", "setpo.verl_plugin" in sys.modules)
""")


@pytest.mark.slow
def test_the_issue_snippet_runs_in_a_fresh_process(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HOME": str(tmp_path)}
    # from a folder that is not the checkout: the installed entry point, not a source-tree artefact, loads the guard
    r = subprocess.run([sys.executable, "-c", SNIPPET], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "guarded: True" in r.stdout


def test_the_guard_is_installed_and_keeps_trl_for_verl_only_when_it_has_the_class():
    import importlib.metadata

    import verl.models.transformers.monkey_patch as mp
    import verl.utils.import_utils as iu
    import verl.utils.model as vm

    from setpo.verl_plugin import install_trl_guard, trl_has_value_head

    assert install_trl_guard()  # idempotent, and the installed verl is the guarded one
    for module in (iu, mp, vm):
        assert getattr(module.is_trl_available, "setpo_guard", False), module.__name__
    trl = importlib.metadata.version("trl")
    assert mp.is_trl_available() is trl_has_value_head(trl)
    if not trl_has_value_head(trl):  # the class really is gone, so verl's import would have raised
        import trl as trl_module

        assert not hasattr(trl_module, "AutoModelForCausalLMWithValueHead")


def test_apply_monkey_patch_on_a_tiny_qwen2_in_process():
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, intermediate_size=128, vocab_size=256))
    ids = torch.randint(0, 256, (2, 9))
    before = m(input_ids=ids).logits
    apply_monkey_patch(model=m, use_remove_padding=False, ulysses_sp_size=1)
    torch.testing.assert_close(m(input_ids=ids).logits, before)  # the patch leaves the plain forward alone
