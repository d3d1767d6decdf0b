"""Weights & Biases logging: `WandbCallback`, which `--wandb` (`RunConfig.wandb`) adds on
rank 0. What it logs, where, and how a resumed run continues its W&B run: docs/trainer.md,
"Weights & Biases". wandb is imported only when asked for; without it, `import_wandb` names
the fix before anything runs.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from grpo_trainer.run.callbacks import Callback, RunState

log = logging.getLogger(__name__)

GIF_STEPS = 200  # the recorded episode is cut after this many steps
GIF_FPS = 15
RUN_ID_FILE = "wandb_run_id"  # in the run directory: the W&B run a resume continues


def import_wandb() -> Any:
    """The `wandb` module, or an `ImportError` that says how to get it or turn it off."""
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "wandb=True (--wandb) needs the wandb package: pip install 'fruit-grpo[wandb]' "
            "(from a checkout: pip install -e '.[wandb]'), or run without it (--no-wandb)",
            name="wandb",
        ) from None
    return wandb


class WandbCallback(Callback):
    """Logs a run to W&B; settings not given here come from `config.run` (`wandb_project`, ...)."""

    def __init__(
        self,
        *,
        project: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        gif: bool = True,
    ) -> None:
        self.wandb = import_wandb()
        self.settings = {"project": project, "entity": entity, "name": name, "mode": mode}
        self.gif = gif
        self.run: Any = None
        self._step = 0
        self._tmp: str | None = None

    def on_train_start(self, state: RunState) -> None:
        run = state.config.run
        name = self.settings["name"] or run.wandb_name
        if name is None and run.run_dir:
            name = Path(run.run_dir).resolve().name
        run_id = self._run_id(state)
        self.run = self.wandb.init(
            id=run_id,
            resume="allow" if run_id else None,
            project=self.settings["project"] or run.wandb_project,
            entity=self.settings["entity"] or run.wandb_entity,
            name=name,
            mode=self.settings["mode"] or run.wandb_mode,
            dir=str(state.run_dir) if state.run_dir else None,
            config=state.config.to_dict(),
        )
        if state.run_dir:
            (state.run_dir / RUN_ID_FILE).write_text(self.run.id + "\n")

    def _run_id(self, state: RunState) -> str | None:
        """The W&B run to continue: the run directory's, when this run resumes one."""
        path = state.run_dir / RUN_ID_FILE if state.run_dir else None
        if path is None or not state.config.run.resume or not path.exists():
            return None
        return path.read_text().strip() or None

    def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
        if self.run is None:
            return
        self._step = int(metrics.get("env_steps", state.env_steps))
        self.run.log(dict(metrics), step=self._step)

    def on_eval(self, state: RunState, metrics: dict[str, float]) -> None:
        """The figures are logged with the update's row; the summary keeps the best score."""
        if self.run is None:
            return
        score = metrics.get("eval_score", math.nan)
        best = self.run.summary.get("best_eval_score")
        if math.isfinite(score) and (best is None or score > best):
            self.run.summary["best_eval_score"] = score

    def on_train_end(self, state: RunState, metrics: dict[str, float]) -> None:
        if self.run is None:
            return
        media: dict[str, Any] = {}
        curve = state.run_dir / "learning_curve.png" if state.run_dir else None
        if curve is not None and curve.exists():
            media["learning_curve"] = self.wandb.Image(str(curve))
        gif = self._record_gif(state) if self.gif else None
        if gif is not None:
            media["agent"] = self.wandb.Video(str(gif), format="gif")
        if media:
            self.run.log(media, step=self._step)
        self._finish(0)

    def on_train_error(self, state: RunState, error: BaseException) -> None:
        self._finish(1)

    def _finish(self, exit_code: int) -> None:
        run, self.run = self.run, None
        try:
            if run is not None:
                run.finish(exit_code=exit_code)
        finally:
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    def _record_gif(self, state: RunState) -> Path | None:
        """One greedy episode as a GIF, or None with a warning (no rendering, no Pillow)."""
        from grpo_trainer.envs import make_envs
        from grpo_trainer.run.evaluation import play_episode, write_animation

        policy = state.policy
        if state.run_dir:
            path = state.run_dir / "agent.gif"
        else:  # removed once the run is finished (W&B keeps its own copy)
            self._tmp = self._tmp or tempfile.mkdtemp(prefix="grpo-wandb-")
            path = Path(self._tmp) / "agent.gif"
        envs = None
        try:
            import PIL  # noqa: F401  (the video extra)

            device = next(policy.parameters()).device
            envs = make_envs(state.config, 1, device, render_mode="rgb_array")
            was_training = policy.training
            policy.eval()
            try:
                frames = play_episode(policy, envs, steps=GIF_STEPS, seed=0)
            finally:
                policy.train(was_training)
            write_animation(frames, path, fps=GIF_FPS)
        except Exception as err:  # a GIF is a nicety: never fail a finished run over it
            log.warning("wandb: no agent GIF (%s: %s)", type(err).__name__, err)
            return None
        finally:
            if envs is not None:
                envs.close()
        return path
