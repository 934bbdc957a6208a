"""The public surface of sdk.episodes is small, pinned and documented."""

from __future__ import annotations

import sdk.episodes


def test_public_surface_is_pinned_and_documented() -> None:
    assert sorted(sdk.episodes.__all__) == sorted(
        [
            "PROBLEM_CODES",
            "READ_SCHEMA_VERSIONS",
            "SCHEMA_VERSION",
            "EpisodeError",
            "EpisodeOptions",
            "ExportSummary",
            "Problem",
            "RewardError",
            "build_episodes",
            "export",
            "group_advantages",
            "llm_judge_reward",
            "open_episodes",
            "read_episodes",
            "role_reward",
            "token_faithful",  # one definition for the exporter, inspect, the viewer and the trainer
            "untrained_messages",
            "ValidationPolicy",  # one per caller: the export, training, the remote backends' upload
            "validate_episode",
            "write_parquet",
        ]
    )
    assert sdk.episodes.SCHEMA_VERSION == 2 and sdk.episodes.READ_SCHEMA_VERSIONS == (1, 2)
    for name in sdk.episodes.__all__:
        obj = getattr(sdk.episodes, name)
        if callable(obj):
            assert obj.__doc__ and "Example" in obj.__doc__, f"sdk.episodes.{name} needs a docstring example"
