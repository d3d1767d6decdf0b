"""The trainer trains bit for bit as it did before its layers were separated.

`REFERENCE` is the last revision before the trainer was split into layers (docs/architecture.md).
Its tree is exported from git into a temporary folder and both trees train the configs of
tests/training_fingerprint.py in fresh processes on this machine; every digest (weights,
optimiser state, checkpoint state) and every metric must be equal. A clone without that
revision (a shallow one) skips the test and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "591fff8"  # GymnaxVectorEnv's CPU hand-over; the last commit before the split
SCRIPT = ROOT / "tests" / "training_fingerprint.py"


def _export(revision: str, into: Path) -> Path:
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{revision}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if known.returncode:  # a shallow clone: the comparison cannot run here, and says so
        pytest.skip(f"revision {revision} is not in this clone (a shallow one?); needs history")
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        done = subprocess.run(
            ["git", "archive", revision], cwd=ROOT, stdout=out, stderr=subprocess.PIPE
        )
    if done.returncode:
        pytest.fail(
            f"git cannot export revision {revision} ({done.stderr.decode().strip()}): this test "
            "needs the repository's history (a full clone)"
        )
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _fingerprints(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=tree, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_training_is_bit_identical_to_the_reference_revision(tmp_path: Path) -> None:
    before = _fingerprints(_export(REFERENCE, tmp_path))
    after = _fingerprints(ROOT)
    assert set(after) == set(before)
    for case in before:
        for part in ("policy", "optimizer", "state"):
            assert after[case][part] == before[case][part], f"{case}: {part} differs"
        assert after[case]["metrics"] == before[case]["metrics"], f"{case}: metrics differ"
