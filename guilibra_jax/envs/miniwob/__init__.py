"""MiniWoB++ (the Farama ``miniwob`` package's real web pages) in headless Chromium.

    from guilibra_jax.envs.miniwob import MiniWobEnv, TASKS, available
    env = MiniWobEnv("click-button", seed=0, scale=2.0)
    obs = env.reset(); obs, done, info = env.step(response, coord_space="norm1000")
    env.success(); env.expert_step(); env.close()

Optional: ``pip install -e '.[miniwob]'`` and Chromium + chromedriver from the system
(Debian: ``apt-get install chromium chromium-driver``). :func:`available` says why not.
Modules: :mod:`.browser` (Chromium), :mod:`.dom` (elements), :mod:`.executor` (GUI-Libra
web actions in the page), :mod:`.env` (episodes), :mod:`.experts` (scripted DOM experts),
:mod:`.record` (demonstrations), :mod:`.pool` (browser workers for online RL).
"""

from guilibra_jax.envs.miniwob.browser import Browser, MiniWobUnavailable, available
from guilibra_jax.envs.miniwob.env import MiniWobEnv
from guilibra_jax.envs.miniwob.experts import KINDS, TASKS, ExpertError, expert_step

__all__ = ["Browser", "MiniWobUnavailable", "available", "MiniWobEnv", "KINDS", "TASKS", "ExpertError",
           "expert_step"]
