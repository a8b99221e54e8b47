"""Tasks of the synthetic world: content and goal, drawn from one integer seed.

A task is platform-independent (the same seed gives the same apps, items and goal on
desktop and mobile); only the actions that solve it differ per platform. Every kind of
task and its instruction template:

    open_app     "Open Mail."
    toggle       "In Settings, turn on Wi-Fi."                (Settings root page)
    toggle_pref  "In Notes, turn on Autosave in Prefs, then go back to the list."
    select       "In Settings, set Font to Large."            (dropdown)
    open_item    "In People, open Kim."                       (may need scrolling)
    answer       "In People, what is Kim's phone number?"     (ends with Answer)
    create       "In Notes, add a note named milk."           (menu, field, submit)
    delete       "In Files, delete cv.pdf."                   (context menu)
    go_back      "Go back to the Mail list and open Ann."     (starts on a detail page)

Start locations: "home" (desktop / home screen), "app" (the task's app open at its
root page), "other" (another app open), "detail" (go_back: a detail page of the app).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

APPS = ("Mail", "Notes", "Files", "People", "Settings")
LIST_APPS = ("Mail", "Notes", "Files", "People")
SETTINGS_TOGGLES = ("Wi-Fi", "Bluetooth", "Airplane", "Dark mode")
FONT_OPTIONS = ("Small", "Medium", "Large")
PREFS = {"Mail": "Sync", "Notes": "Autosave", "Files": "Previews", "People": "Badges"}
CREATE_APPS = {"Notes": "Title", "People": "Name"}      # app -> form field label
DELETE_APPS = ("Files", "Notes")
TASK_KINDS = ("open_app", "toggle", "toggle_pref", "select", "open_item", "answer", "create",
              "delete", "go_back")

NAMES = ("Ann", "Bob", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lea",
         "Max", "Ned", "Oli", "Pam", "Roy", "Sue", "Tom", "Uma", "Val", "Wes", "Zoe", "Amy")
WORDS = ("milk", "bread", "trip", "gym", "rent", "call", "book", "plan", "gift", "keys", "tea",
         "band", "lunch", "park", "taxes", "yoga", "paint", "train", "movie", "sale")
FILES = ("report.txt", "notes.md", "photo.png", "song.mp3", "budget.csv", "todo.txt", "cv.pdf",
         "map.png", "data.csv", "draft.doc", "plan.pdf", "logo.png", "memo.txt", "chart.png")


@dataclasses.dataclass(frozen=True)
class Item:
    """One list entry of an app; ``fields`` are the lines its detail page shows."""

    name: str
    fields: tuple[tuple[str, str], ...] = ()

    def field(self, key: str) -> str:
        return dict(self.fields)[key]


@dataclasses.dataclass(frozen=True)
class Content:
    """The initial data of all apps."""

    items: dict[str, tuple[Item, ...]]        # list app -> items, in display order
    settings: dict[str, bool]                 # Settings toggles
    font: str                                 # Settings dropdown
    prefs: dict[str, bool]                    # list app -> its Prefs toggle


@dataclasses.dataclass(frozen=True)
class Task:
    seed: int
    kind: str
    app: str
    instruction: str
    start: str                   # home | app | other | detail
    start_app: str | None        # the app open at the start (start == other / app / detail)
    item: str | None = None      # open_item / answer / delete / go_back target; create text
    start_item: str | None = None  # go_back: the detail page shown at the start
    setting: str | None = None   # toggle / toggle_pref / select
    value: Any = None            # toggle: bool; select: option; answer: expected text
    content: Content | None = None


def _content(rng: random.Random) -> Content:
    people = rng.sample(NAMES, rng.randint(6, 14))
    mail_from = rng.sample(NAMES, rng.randint(6, 14))
    notes = rng.sample(WORDS, rng.randint(4, 10))
    files = rng.sample(FILES, rng.randint(5, 12))
    phones = rng.sample(range(100, 1000), len(people))
    items = {
        "People": tuple(Item(n, (("Name", n), ("Phone", f"555-{p}"))) for n, p in zip(people, phones)),
        "Mail": tuple(Item(n, (("From", n), ("Subject", rng.choice(WORDS)))) for n in mail_from),
        "Notes": tuple(Item(w, (("Title", w), ("Text", rng.choice(WORDS)))) for w in notes),
        "Files": tuple(Item(f, (("Name", f), ("Size", f"{rng.randint(2, 99)} KB"))) for f in files),
    }
    return Content(items=items,
                   settings={s: rng.random() < 0.5 for s in SETTINGS_TOGGLES},
                   font=rng.choice(FONT_OPTIONS),
                   prefs={a: rng.random() < 0.5 for a in LIST_APPS})


_ANSWER_FIELD = {"People": "Phone", "Mail": "Subject", "Files": "Size"}
_ANSWER_TEMPLATE = {"People": "In People, what is {item}'s phone number?",
                    "Mail": "In Mail, what is the subject of the mail from {item}?",
                    "Files": "In Files, what is the size of {item}?"}


def _on_off(v: bool) -> str:
    return "on" if v else "off"


def make_task(seed: int, kind: str | None = None) -> Task:
    """The task of ``seed`` (its kind drawn uniformly unless given)."""
    rng = random.Random(f"guilibra-world-task-{seed}")
    content = _content(rng)
    drawn_kind = rng.choice(TASK_KINDS)
    kind = kind or drawn_kind
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {TASK_KINDS}")
    start_roll = rng.random()

    def start_for(app: str) -> tuple[str, str | None]:
        if start_roll < 0.4:
            return "home", None
        if start_roll < 0.8 and kind != "open_app":
            return "app", app
        return "other", rng.choice([a for a in APPS if a != app])

    if kind == "open_app":
        app = rng.choice(APPS)
        start, start_app = start_for(app)
        return Task(seed, kind, app, f"Open {app}.", start, start_app, content=content)
    if kind == "toggle":
        setting = rng.choice(SETTINGS_TOGGLES)
        value = not content.settings[setting]
        start, start_app = start_for("Settings")
        return Task(seed, kind, "Settings", f"In Settings, turn {_on_off(value)} {setting}.",
                    start, start_app, setting=setting, value=value, content=content)
    if kind == "select":
        value = rng.choice([o for o in FONT_OPTIONS if o != content.font])
        start, start_app = start_for("Settings")
        return Task(seed, kind, "Settings", f"In Settings, set Font to {value}.", start, start_app,
                    setting="Font", value=value, content=content)
    if kind == "toggle_pref":
        app = rng.choice(LIST_APPS)
        value = not content.prefs[app]
        start, start_app = start_for(app)
        return Task(seed, kind, app, f"In {app}, turn {_on_off(value)} {PREFS[app]} in Prefs, "
                    f"then go back to the list.", start, start_app, setting=PREFS[app], value=value,
                    content=content)
    if kind == "create":
        app = rng.choice(sorted(CREATE_APPS))
        existing = {i.name for i in content.items[app]}
        pool = WORDS if app == "Notes" else NAMES
        text = rng.choice([w for w in pool if w not in existing])
        noun = "a note" if app == "Notes" else "a contact"
        start, start_app = start_for(app)
        return Task(seed, kind, app, f"In {app}, add {noun} named {text}.", start, start_app,
                    item=text, content=content)
    if kind == "answer":
        app = rng.choice(sorted(_ANSWER_FIELD))
        item = rng.choice(content.items[app])
        start, start_app = start_for(app)
        return Task(seed, kind, app, _ANSWER_TEMPLATE[app].format(item=item.name), start, start_app,
                    item=item.name, value=item.field(_ANSWER_FIELD[app]), content=content)
    if kind == "delete":
        app = rng.choice(DELETE_APPS)
        item = rng.choice(content.items[app]).name
        start, start_app = start_for(app)
        return Task(seed, kind, app, f"In {app}, delete {item}.", start, start_app, item=item,
                    content=content)
    app = rng.choice(LIST_APPS)
    item, other = rng.sample([i.name for i in content.items[app]], 2)
    if kind == "open_item":
        start, start_app = start_for(app)
        return Task(seed, kind, app, f"In {app}, open {item}.", start, start_app, item=item,
                    content=content)
    return Task(seed, "go_back", app, f"Go back to the {app} list and open {item}.", "detail", app,
                item=item, start_item=other, content=content)
