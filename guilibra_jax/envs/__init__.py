"""Synthetic multi-platform GUI world (pure Python + PIL) for online evaluation and demos.
(MiniWoB++ in headless Chromium, the optional real outside world: :mod:`.miniwob`, not
imported here.)

    env = make_env("desktop" | "mobile", seed, screen_size=None)   # small screens by default
    obs = env.reset()                      # screenshot, instruction, history, platform, elements
    obs, done, info = env.step(action)     # actions.Action (pixels unless coord_space=...),
                                           # actions.ToolCall (tool space), or response text
    env.success(); env.expert_step(); env.needs_convention(fmt)
    export_dataset(out_dir, platforms, n_tasks, seed, split_fraction, screen_size)

Five apps (Mail, Notes, Files, People, Settings), nine task kinds (:mod:`.tasks`).
The same intent needs different actions per platform (:mod:`.expert`)::

    intent     desktop                               mobile
    open app   Click value "double" on the icon      Click the icon (or OpenApp)
    back       Click the window's close button       NavigateBack
               (or KeyboardPress ctrl+w)
    home       (not needed: icons stay visible)      NavigateHome (or Back on a root page)
    scroll     Scroll down (or KeyboardPress         Swipe up on the list (or Scroll down)
               pagedown)
    context    Click value "right" on the item       LongPress on the item
    others     the same: Click, Write, Select, KeyboardPress enter (submit), Answer, Terminate

GUI-Libra has no desktop-only action types: a Click's ``value`` spells the desktop click
kind (None = single, "double", "right"), which map to computer_use left_click /
double_click / right_click (:mod:`.adapter`). What each platform accepts is in
:mod:`.world`; a convention of the other platform is a no-op there.
"""

from guilibra_jax.envs.adapter import Event
from guilibra_jax.envs.env import GuiEnv, Observation, make_env
from guilibra_jax.envs.expert import CONVENTION_INTENTS, CRITICAL_INTENTS, Demo, ExpertStep
from guilibra_jax.envs.export import export_dataset, heldout_task_seeds, load_records, task_split
from guilibra_jax.envs.tasks import TASK_KINDS, Task, make_task
from guilibra_jax.envs.world import DEFAULT_SCREEN_SIZE, REALISTIC_SCREEN_SIZE

__all__ = ["Event", "GuiEnv", "Observation", "make_env", "CRITICAL_INTENTS", "CONVENTION_INTENTS",
           "Demo", "ExpertStep", "export_dataset", "heldout_task_seeds", "load_records", "task_split",
           "TASK_KINDS", "Task", "make_task", "DEFAULT_SCREEN_SIZE", "REALISTIC_SCREEN_SIZE"]
