"""One headless Chromium, driven through Selenium, that plays MiniWoB++ task pages.

    b = Browser(scale=2.0)              # needs `pip install -e .[miniwob]` and Chromium
    b.open("click-button")               # load the task page (once per task; cheap after)
    b.start_episode(seed=3)               # same seed -> same problem
    b.utterance(); b.dom(); b.screenshot(); b.metadata(); b.close()

Chromium and chromedriver come from the system package manager (Debian:
``apt-get install chromium chromium-driver``); their paths are read from
``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER`` (the variables the ``miniwob``
package reads), else looked up on PATH. A missing piece raises :class:`MiniWobUnavailable`
naming what to install. The browser never reaches the network: pages are ``file://``, host
resolution maps every name to nothing, and Chromium's background services are off.

Geometry: the task occupies the top-left ``TASK_WIDTH x TASK_HEIGHT`` CSS pixels of the
viewport (160 x 210: the instruction bar, then the task). Screenshots are that region at
``scale`` device pixels per CSS pixel, so a screenshot pixel is ``scale`` times a CSS pixel.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import time
from typing import Any

from PIL import Image

TASK_WIDTH, TASK_HEIGHT = 160, 210
WINDOW_SIZE = (500, 400)          # CSS pixels (Chromium keeps the width >= 500); the task sits top-left
EPISODE_TIME_LIMIT_S = 3600.0     # the page's own timer (MiniWoB default 10 s) would fail slow agents

# Chromium switches that keep it off every network and quiet in a container. The last one makes
# a repaint re-raster whole tiles: with partial raster, what a frame re-rasters depends on how
# frames coalesce, so under CPU load an antialiased edge beside a repainted box (a button's
# corner above a freshly focused input) came out one grey level off and a replayed episode did
# not reproduce its page (7 of 48 replays under load before, 0 of 48 after).
OFFLINE_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
    "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--disable-breakpad",
    "--metrics-recording-only", "--no-pings", "--dns-prefetch-disable", "--no-proxy-server",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,"
    "CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars", "--mute-audio", "--font-render-hinting=none", "--disable-partial-raster",
)

# A text caret blinks on a timer, so two screenshots of one focused input differ by when they
# were taken and a replayed episode would not reproduce its pages. The caret is held still
# (visible) where Chromium knows ``caret-animation`` (M139+), else hidden.
STEADY_CARET_JS = """
var still = CSS.supports('caret-animation', 'manual');
var s = document.createElement('style');
s.textContent = still ? '* { caret-animation: manual !important; }' : '* { caret-color: transparent !important; }';
document.head.appendChild(s);
return still;
"""


class MiniWobUnavailable(RuntimeError):
    """The ``miniwob`` package, Chromium or chromedriver is missing."""


def _need_packages():
    try:
        import miniwob  # noqa: F401
        import selenium  # noqa: F401
    except ImportError as e:
        raise MiniWobUnavailable(
            f"MiniWoB++ needs the optional extra: pip install -e '.[miniwob]' ({e})") from None


def chrome_paths() -> tuple[str, str]:
    """(chromium binary, chromedriver): from MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER,
    else from PATH; raises MiniWobUnavailable naming what is missing."""
    binary = os.environ.get("MINIWOB_CHROME_BINARY") or next(
        (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = [name for name, path in (("Chromium (MINIWOB_CHROME_BINARY)", binary),
                                       ("chromedriver (MINIWOB_CHROMEDRIVER)", driver))
               if not path or not os.path.exists(path)]
    if missing:
        raise MiniWobUnavailable(
            f"MiniWoB++ needs {' and '.join(missing)}: on Debian `apt-get install chromium chromium-driver`, "
            f"or set MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER to their paths")
    return binary, driver


def available() -> str | None:
    """None when a browser can start here, else the reason it cannot (for test skips)."""
    try:
        _need_packages()
        chrome_paths()
    except MiniWobUnavailable as e:
        return str(e)
    return None


def html_dir() -> str:
    import miniwob
    return os.path.join(os.path.dirname(miniwob.__file__), "html", "miniwob")


def task_names() -> list[str]:
    """Every MiniWoB++ task page the installed package ships."""
    return sorted(f[:-5] for f in os.listdir(html_dir()) if f.endswith(".html"))


class Browser:
    """A headless Chromium on MiniWoB++ pages. Not thread-safe; one per process/worker."""

    def __init__(self, scale: float = 1.0, episode_time_limit_s: float = EPISODE_TIME_LIMIT_S):
        _need_packages()
        binary, driver_path = chrome_paths()
        os.environ.setdefault("SE_AVOID_STATS", "true")    # Selenium Manager stays offline
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.scale = float(scale)
        self.time_limit_ms = int(episode_time_limit_s * 1000)
        opts = webdriver.ChromeOptions()
        opts.binary_location = binary
        for flag in OFFLINE_FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}")
        opts.add_argument(f"--force-device-scale-factor={self.scale:g}")
        try:
            self.driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
        except Exception as e:       # selenium's errors carry chromedriver's whole log
            raise MiniWobUnavailable(f"Chromium did not start ({binary}, {driver_path}): "
                                     f"{str(e).splitlines()[0][:300]}") from None
        self.driver.implicitly_wait(0)
        self.task: str | None = None

    # ------------------------------------------------------------------ page lifecycle
    def open(self, task: str) -> None:
        """Load ``task``'s page (no-op when it is already loaded)."""
        if task == self.task:
            return
        path = os.path.join(html_dir(), f"{task}.html")
        if not os.path.exists(path):
            raise ValueError(f"unknown MiniWoB++ task {task!r}: no {path}")
        self.driver.get("file://" + path)
        for _ in range(100):
            if self.js("return !!document.getElementById('sync-task-cover');"):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError(f"MiniWoB++ page {task!r} did not load")
        self.steady_caret_visible = bool(self.js(STEADY_CARET_JS))
        self.task = task

    def start_episode(self, seed: Any) -> None:
        """Start a new problem of the loaded task from ``seed`` (deterministic per seed).

        The pointer goes back to the viewport's origin first, where a fresh browser has it:
        left where the last episode clicked, it hovers over the new page and changes what a
        click renders (a button's edge one grey level off), so a replayed episode would not
        reproduce the pages of the one it resumes."""
        from guilibra_jax.envs.miniwob.executor import _chain
        chain = _chain(self)
        chain.w3c_actions.pointer_action.move_to_location(0, 0)
        chain.w3c_actions.perform()
        self.js("core.endEpisode(0);")        # back to the sync screen (no-op if already there)
        self.js(f"Math.seedrandom({str(seed)!r}); core.setDataMode('train');"
                f"core.EPISODE_MAX_TIME = {self.time_limit_ms}; core.startEpisodeReal();")
        for _ in range(100):
            if self.js("return WOB_TASK_READY;"):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError(f"MiniWoB++ task {self.task!r} did not become ready")

    def close(self) -> None:
        try:
            self.driver.quit()
        except Exception:
            pass

    # ------------------------------------------------------------------ reading the page
    def js(self, script: str, *args) -> Any:
        return self.driver.execute_script(script, *args)

    def utterance(self) -> str:
        u = self.js("return core.getUtterance();")
        return u["utterance"] if isinstance(u, dict) else str(u)

    def dom(self) -> dict:
        """``core.getDOMInfo()``: the page's element tree with CSS-pixel boxes."""
        return self.js("return core.getDOMInfo();")

    def metadata(self) -> dict:
        """done, raw_reward (1 success, -1 failure; partial on some tasks), reason."""
        return self.js("return {done: WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,"
                       " reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON};")

    def screenshot(self) -> Image.Image:
        """The task region, ``scale`` device pixels per CSS pixel, RGB."""
        png = base64.b64decode(self.driver.get_screenshot_as_base64())
        img = Image.open(io.BytesIO(png)).convert("RGB")
        w, h = round(TASK_WIDTH * self.scale), round(TASK_HEIGHT * self.scale)
        if img.size[0] < w or img.size[1] < h:
            raise RuntimeError(f"viewport screenshot {img.size} smaller than the task region {(w, h)}")
        return img.crop((0, 0, w, h))

    @property
    def screen_size(self) -> tuple[int, int]:
        return round(TASK_WIDTH * self.scale), round(TASK_HEIGHT * self.scale)
