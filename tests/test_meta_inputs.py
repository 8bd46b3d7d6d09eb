"""Meta tensors (shapes without values) are refused with a ValueError naming the device,
by every public entry point of the core that reads tensors."""

import pytest
import torch

import setpo
from setpo.diversity import diversity_term

META = torch.device("meta")


@pytest.mark.parametrize("call", [
    lambda: setpo.diversity_marginals(torch.empty(6, 4, device=META), group_size=3),
    lambda: setpo.diversity_marginals(torch.randn(6, 4), torch.zeros(6, device=META)),
    lambda: setpo.cosine_kernel(torch.empty(3, 4, device=META)),
    lambda: setpo.set_diversity(torch.empty(3, 4, device=META)),
    lambda: diversity_term("pairwise", torch.empty(6, 4, device=META), group_size=3),
    lambda: setpo.group_advantages(torch.empty(6, device=META), group_size=3),
    lambda: setpo.setpo_advantages(torch.empty(6, device=META), torch.randn(6, 4), group_size=3),
    lambda: setpo.setpo_advantages(torch.rand(6), torch.empty(6, 4, device=META), group_size=3),
    lambda: setpo.groups_with_signal(torch.empty(6, device=META), group_size=3),
    lambda: setpo.mean_pairwise_similarity(torch.empty(6, 4, device=META), group_size=3),
], ids=["marginals", "index", "kernel", "set_diversity", "pairwise", "group_adv", "setpo_rewards",
        "setpo_emb", "signal", "similarity"])
def test_meta_tensors_are_refused_naming_the_device(call):
    with pytest.raises(ValueError, match="'meta' device"):
        call()
