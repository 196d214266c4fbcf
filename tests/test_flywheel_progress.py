"""`flywheel run` on the command line: the same live numbers as the Train page through its
progress bar (each stage's count and latest metrics), and the same warning before it starts
when the SFT data is too small to learn from."""
from __future__ import annotations

import re

from tests.test_flywheel_team import tandem


def test_flywheel_run_prints_live_numbers_and_warns_of_one_sft_episode(store):
    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    for traj in demonstrate(plan(1, families=["click_button"]), env_kw={"width": 224, "height": 168}):
        trajectory_to_episode(traj, store, producer="expert")  # one successful demonstration: SFT data once routed
    store.set_setting("flywheel.config", {"families": ["click_button"], "width": 224, "height": 168, "max_steps": 1,
                                          "eval_episodes": 1, "rollouts": 0, "ct_steps": 0, "sft_steps": 3,
                                          "ppo_updates": 0, "max_new_tokens": 8, "miniwob_episodes": 0})
    store.close()
    run = tandem("flywheel", "run", "--iterations", "1", "--data", str(store.root))
    err = run.stderr
    # before routing, the unscored episode may become SFT data: counted as at most
    assert re.search(r"^warning: At most 1 SFT episode \(0 in the SFT pool, 1 not yet scored\): the model will memorize it rather than learn; record or import "
                     r"more \(the SFT stage would show each of its \d+ steps? about \d+ times; at least 8 episodes, "
                     r"one batch, are needed\)\.$", err, re.M), err[-3000:]
    # the bar's postfix: every SFT step with its loss, then the evaluation's episodes
    steps = [int(k) for k in re.findall(r"fine-tuning on the SFT pool step (\d)/3 · loss \d+\.\d{3}", err)]
    assert sorted(set(steps)) == [1, 2, 3], err[-3000:]
    assert "evaluating both models on fresh held-out tasks episode 2/2" in err, err[-3000:]
    status = tandem("flywheel", "status", "--data", str(store.root))  # the same warning, after routing: in the pool
    assert "warning: Only 1 SFT episode: the model will memorize it" in status.stdout, status.stdout
