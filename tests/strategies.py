"""Hypothesis strategies shared by the env test files."""

from typing import Any

from hypothesis import strategies as st

from fruit_env.games.fruit_catcher.params import OBS_MODES


@st.composite
def rule_sets(
    draw: st.DrawFn, *, max_width: int, max_height: int, max_score: int, max_steps: int
) -> dict[str, Any]:
    """Random valid rules covering every FruitParams field, small boards included."""
    width = draw(st.integers(2, max_width))
    height = draw(st.integers(2, max_height))
    max_fruits = draw(st.integers(1, 5))
    return {
        "width": width,
        "height": height,
        "basket_width": draw(st.integers(1, width)),
        "max_fruits": max_fruits,
        "min_fruits": draw(st.integers(1, max_fruits)),
        "spawn_prob": draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0)),
        "min_spawn_gap": draw(st.integers(0, height + 1)),
        "win_score": draw(st.integers(1, max_score)),
        "lose_score": draw(st.integers(-max_score, -1)),
        "max_episode_steps": draw(st.integers(1, max_steps)),
        "obs_mode": draw(st.sampled_from(OBS_MODES)),
    }
