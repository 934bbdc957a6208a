"""``sdk.episodes.group_advantages`` is what TRL's GRPOTrainer computes (checked with TRL's own ``nanstd``)."""

from __future__ import annotations

import pytest

from sdk.episodes import group_advantages

torch = pytest.importorskip("torch")
trl_utils = pytest.importorskip("trl.trainer.utils")


@pytest.mark.parametrize(
    "rewards", [[1.0, 0.0], [1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.4, 0.4, 1.0], [3.0, 3.0, 3.0]]
)
def test_matches_trls_group_scaling(rewards: list[float]) -> None:
    r = torch.tensor(rewards, dtype=torch.float64).view(1, -1)
    # TRL 1.16 GRPOTrainer, scale_rewards="group": (r - group mean) / (nanstd(group) + 1e-4).
    expected = (r - r.mean(dim=1, keepdim=True)) / (trl_utils.nanstd(r, dim=1) + 1e-4)
    # TRL divides in float32 (nanstd's count correction), hence the tolerance.
    assert group_advantages(rewards) == pytest.approx(expected.view(-1).tolist(), abs=1e-6)


def test_edge_cases_and_other_scalings() -> None:
    assert group_advantages([1.0, 0.0]) == pytest.approx([0.70700, -0.70700], abs=1e-5)
    assert group_advantages([0.5]) == [0.0]
    assert group_advantages([2.0, 2.0]) == [0.0, 0.0]
    assert group_advantages([]) == []
    assert group_advantages([1.0, 0.0], scale=False) == [0.5, -0.5]
    assert group_advantages([1.0, 0.0], std=1.0) == pytest.approx([0.5 / 1.0001, -0.5 / 1.0001])
