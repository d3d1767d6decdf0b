"""The training examples in examples/ run as documented (tiny budgets)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loading import load_module

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_callbacks_example_prints_evaluations_and_stops_without_improvement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evaluated after every update; the first evaluation that is no better than the best so
    far requests the stop, which takes effect after the next update (evaluated too)."""
    example = load_module(EXAMPLES / "callbacks.py", "callbacks_example")
    per_update = 4 * 8 * 32  # 4 groups x 8 members x the default 32-step rollouts
    flags = ["--num-groups", "4", "--total-env-steps", str(12 * per_update), "--patience", "1"]
    flags += ["--eval-every", str(per_update), "--eval-episodes", "16"]
    trainer = example.main([*flags, "--run-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    scores = [float(s) for s in re.findall(r"eval score (\S+)", out)]
    assert len(scores) == trainer.update_index  # one evaluation per update
    stale = next((k for k in range(1, len(scores)) if scores[k] <= max(scores[:k])), None)
    if stale is None:  # every evaluation improved: the budget ended the run
        assert trainer.stop_reason is None and trainer.update_index == 12
    else:
        assert trainer.stop_reason == "no better evaluation in 1 in a row"
        assert trainer.update_index == stale + 2  # the request rides the next update
    assert out.count("new best policy saved") == len(
        [k for k in range(len(scores)) if scores[k] > max(scores[:k], default=float("-inf"))]
    )


@pytest.mark.slow
def test_grpo_one_page_runs_as_documented_and_learns(tmp_path: Path) -> None:
    """`python examples/grpo_one_page.py` with its defaults, on one core as its docstring
    says: a line per update, the mean return of the last three updates in which episodes
    ended far above that of the first three, and nothing written."""
    command = [sys.executable, str(EXAMPLES / "grpo_one_page.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=600
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 60
    returns = [float(r) for r in re.findall(r"return +(\S+),", done.stdout)]
    ended = [r for r in returns if not math.isnan(r)]  # episodes end every ~6 updates
    assert len(returns) == 60 and len(ended) >= 6
    assert sum(ended[-3:]) / 3 > sum(ended[:3]) / 3 + 10  # seeded: about -2 against -24
    assert not any(tmp_path.iterdir())
