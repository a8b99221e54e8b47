"""Scripted DOM experts for MiniWoB++ tasks: the next step of a demonstration, read from
the live page.

    step = expert_step(env)        # envs.expert.ExpertStep: action, target box, reasoning
    TASKS                          # the tasks that have an expert, by kind (click/type/select)

Each expert is a function of the page's *current* state (elements, field values, the
task's own state where the page keeps it), so it can act from any state an agent reached:
the expert's action there is the per-step label that online RL verifies responses against.
Targets are the element's visible box (unit space) and its centre; alternatives are other
elements that do the same (the label of a checkbox or radio). Reasoning is a short
sentence pair: what the task asks, what to do now.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from guilibra_jax import actions as A
from guilibra_jax.envs.adapter import Event
from guilibra_jax.envs.expert import Demo, ExpertStep
from guilibra_jax.envs.miniwob.browser import TASK_HEIGHT, TASK_WIDTH
from guilibra_jax.envs.miniwob.dom import clip_box


class ExpertError(RuntimeError):
    """The expert cannot find what its task needs on the page."""


# --------------------------------------------------------------------------------------
# Reading the page
# --------------------------------------------------------------------------------------

_QUERY_JS = """
var out = [];
// a point of e that a click reaches (e or a descendant on top there), nearest the centre
var hitPoint = function (e, r) {
  var best = null, bd = 1e9, cx = r.left + r.width / 2, cy = r.top + r.height / 2;
  for (var i = 1; i < 8; i++) for (var j = 1; j < 8; j++) {
    var x = r.left + r.width * i / 8, y = r.top + r.height * j / 8;
    var h = document.elementFromPoint(x, y), d = Math.abs(x - cx) + Math.abs(y - cy);
    if (h && (h === e || e.contains(h)) && d < bd) { best = [x, y]; bd = d; }
  }
  return best;
};
document.querySelectorAll(arguments[0]).forEach(function (e) {
  var r = e.getBoundingClientRect();
  var sel = e.tagName === 'SELECT' && e.selectedIndex >= 0 ? e.options[e.selectedIndex].text : null;
  out.push({tag: e.tagName.toLowerCase(), id: e.id, text: (e.textContent || '').trim(),
            value: (e.value === undefined ? null : String(e.value)), checked: !!e.checked,
            selected: sel, cls: (typeof e.className === 'string') ? e.className : '',
            dtype: e.getAttribute('data-type'), href: e.getAttribute('href'),
            left: r.left, top: r.top, width: r.width, height: r.height,
            visible: r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden',
            focused: document.activeElement === e, hit: hitPoint(e, r)});
});
return out;
"""


@dataclasses.dataclass
class El:
    """A page element as the expert sees it (CSS-pixel geometry)."""

    tag: str
    id: str
    text: str
    value: str | None
    checked: bool
    selected: str | None
    cls: str
    dtype: str | None
    href: str | None
    left: float
    top: float
    width: float
    height: float
    visible: bool
    focused: bool
    hit: list | None = None     # CSS point where a click reaches this element (None: covered)

    @property
    def box_unit(self) -> tuple[float, float, float, float] | None:
        c = clip_box(self.left, self.top, self.width, self.height)
        if c is None:
            return None
        return c[0] / TASK_WIDTH, c[1] / TASK_HEIGHT, c[2] / TASK_WIDTH, c[3] / TASK_HEIGHT


class Page:
    def __init__(self, env):
        self.env = env
        self.utterance = env.instruction

    def q(self, selector: str) -> list[El]:
        return [El(**d) for d in self.env.browser.js(_QUERY_JS, selector)]

    def one(self, selector: str, text: str | None = None, visible: bool | None = True) -> El:
        for e in self.q(selector):
            if (text is None or e.text == text) and (visible is None or e.visible == visible):
                return e
        raise ExpertError(f"{self.env.task}: no {'visible ' if visible else ''}element {selector!r}"
                          + (f" with text {text!r}" if text is not None else ""))

    def js(self, script: str):
        return self.env.browser.js(script)

    def quoted(self) -> str:
        m = re.search(r'"([^"]*)"', self.utterance)
        if not m:
            raise ExpertError(f"{self.env.task}: no quoted text in {self.utterance!r}")
        return m.group(1)

    def match(self, pattern: str) -> re.Match:
        m = re.search(pattern, self.utterance)
        if not m:
            raise ExpertError(f"{self.env.task}: instruction {self.utterance!r} does not match {pattern!r}")
        return m


# --------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Plan:
    kind: str                  # click | write | select | key
    el: El | None
    target: str                # element description (action_target)
    why: str                   # the reasoning's second sentence
    value: str | None = None
    also: tuple[El, ...] = ()  # other elements that do the same (alternatives)


def click(el: El, target: str, why: str, also: tuple[El, ...] = ()) -> Plan:
    return Plan("click", el, target, why, None, also)


def write(el: El, value: str, target: str, why: str) -> Plan:
    return Plan("write", el, target, why, value)


def select(el: El, value: str, target: str, why: str) -> Plan:
    return Plan("select", el, target, why, value)


def _centre(box) -> tuple[float, float]:
    return round((box[0] + box[2]) / 2, 6), round((box[1] + box[3]) / 2, 6)


def _demo(kind: str, el: El, value: str | None, desc: str, target: str) -> Demo:
    box = el.box_unit
    if box is None:
        raise ExpertError(f"target {target!r} lies outside the task region")
    p = _centre(box)
    if el.hit is not None and kind == "click":     # the centre may be covered by another element
        p = round(el.hit[0] / TASK_WIDTH, 6), round(el.hit[1] / TASK_HEIGHT, 6)
    atype = {"click": "Click", "write": "Write", "select": "Select"}[kind]
    return Demo(A.Action(atype, desc, value, p, target), None, tuple(round(c, 6) for c in box))


def to_step(plan: Plan, goal: str) -> ExpertStep:
    """The ExpertStep of a plan: main demo, alternatives, event, reasoning."""
    if plan.kind == "key":
        desc = f"Press {plan.value}"
        demo = Demo(A.Action("KeyboardPress", desc, plan.value, None, None))
        return ExpertStep("key", Event("key", text=plan.value), demo, (), f"{goal} {plan.why}")
    desc = {"click": f"Click {plan.target}", "write": f"Type \"{plan.value}\" into {plan.target}",
            "select": f"Select \"{plan.value}\" in {plan.target}"}[plan.kind]
    main = _demo(plan.kind, plan.el, plan.value, desc, plan.target)
    alts = tuple(_demo(plan.kind, e, plan.value, desc, plan.target) for e in plan.also if e.box_unit)
    event = {"click": Event("click", main.action.point_2d),
             "write": Event("type", main.action.point_2d, text=plan.value),
             "select": Event("select", main.action.point_2d, text=plan.value)}[plan.kind]
    intent = "submit" if plan.kind == "click" and "submit" in plan.target.lower() else plan.kind
    return ExpertStep(intent, event, main, alts, f"{goal} {plan.why}")


# --------------------------------------------------------------------------------------
# The experts: page -> (goal sentence, plan)
# --------------------------------------------------------------------------------------

Expert = Callable[[Page], tuple[str, Plan]]
EXPERTS: dict[str, Expert] = {}
KINDS: dict[str, str] = {}


def expert(*tasks: str, kind: str):
    def deco(fn: Expert) -> Expert:
        for t in tasks:
            EXPERTS[t] = fn
            KINDS[t] = kind
        return fn
    return deco


def _submit(p: Page, label: str = "Submit") -> El:
    for sel in ("#subbtn", "button"):
        for e in p.q(sel):
            if e.visible and e.text.lower() == label.lower():
                return e
    raise ExpertError(f"{p.env.task}: no visible {label!r} button")


def _fill(p: Page, fields: list[tuple[str, str, str]], goal: str, button: str = "Submit") -> tuple[str, Plan]:
    """Write each (selector, value, name) whose field differs, then press ``button``."""
    for sel, value, name in fields:
        el = p.one(sel)
        if el.value != value:
            return goal, write(el, value, f"the {name} field", f"The {name} field does not hold \"{value}\" yet, "
                                                                    f"so I type it there.")
    return goal, click(_submit(p, button), f"the \"{button}\" button",
                       f"Every field is filled in, so I press \"{button}\".")


@expert("click-test", kind="click")
def _click_test(p):
    return "The task is to click the button.", click(p.one("#subbtn"), "the \"Click Me!\" button",
                                                      "There is one button, \"Click Me!\", so I click it.")


@expert("click-test-2", "click-test-transfer", "click-button", "unicode-test", kind="click")
def _click_named_button(p):
    name = p.match(r'[Cc]lick (?:on the "(.*)" button|button (.*))\.')
    name = name.group(1) or name.group(2)
    btn = p.one("button", text=name)
    return (f"The task is to click the button labelled \"{name}\".",
            click(btn, f"the \"{name}\" button", f"I find the \"{name}\" button and click it."))


@expert("click-button-sequence", kind="click")
def _click_sequence(p):
    n = int(p.js("return buttonsPushed.length;"))
    name = "ONE" if n == 0 else "TWO"
    why = ("Button ONE comes first." if n == 0 else "Button ONE is done; now button TWO.")
    return "The task is to click button ONE, then button TWO.", click(p.one("button", text=name),
                                                                       f"the \"{name}\" button", why)


@expert("click-link", kind="click")
def _click_link(p):
    name = p.quoted()
    return (f"The task is to click the link \"{name}\".",
            click(p.one("span.alink", text=name), f"the link \"{name}\"", "I find that link in the text and click it."))


@expert("click-dialog", "click-dialog-2", kind="click")
def _click_dialog(p):
    name = p.quoted()
    if name.lower() == "x":
        btn = p.one("button.ui-dialog-titlebar-close")
    else:
        btn = next((e for e in p.q(".ui-dialog button") if e.visible and e.text == name), None)
        if btn is None:
            raise ExpertError(f"no dialog button {name!r}")
    return (f"The task is to click the dialog's \"{name}\" button.",
            click(btn, f"the dialog's \"{name}\" button", "It is in the dialog box, so I click it."))


@expert("click-tab", kind="click")
def _click_tab(p):
    n = p.match(r"Tab #(\d+)").group(1)
    return (f"The task is to click Tab #{n}.",
            click(p.one("a.ui-tabs-anchor", text=f"Tab #{n}"), f"the \"Tab #{n}\" tab", "I click that tab's title."))


@expert("click-widget", kind="click")
def _click_widget(p):
    kind = p.quoted()
    el = p.one(f'[data-type="{kind}"]')
    return (f"The task is to click a \"{kind}\" widget.",
            click(el, f"the {kind} widget", f"The {kind} widget is the one to click."))


@expert("click-collapsible", kind="click")
def _click_collapsible(p):
    goal = "The task is to expand the section and click Submit."
    if p.js("return $('.ui-accordion-content:visible').length;"):
        return goal, click(_submit(p), "the \"Submit\" button", "The section is open, so I click Submit.")
    return goal, click(p.one("h3.ui-accordion-header"), "the section header",
                       "The section is closed, so I click its header to expand it.")


@expert("click-option", kind="click")
def _click_option(p):
    name = p.match(r"Select (.*) and click Submit\.").group(1)
    goal = f"The task is to select \"{name}\" and click Submit."
    for lab, radio in zip(p.q("#boxes label"), p.q("#boxes label input")):
        if lab.text != name:
            continue
        if not radio.checked:
            return goal, click(radio, f"the \"{name}\" option", f"\"{name}\" is not selected yet, so I click it.",
                               also=(lab,))
        return goal, click(_submit(p), "the \"Submit\" button", f"\"{name}\" is selected, so I submit.")
    raise ExpertError(f"no option {name!r}")


def _checkbox_targets(utterance: str) -> list[str]:
    m = re.match(r"Select (.*) and click Submit\.", utterance)
    if not m:
        raise ExpertError(f"unexpected instruction {utterance!r}")
    words = m.group(1)
    if words == "nothing":
        return []
    return [w for w in re.split(r",\s*|\s+and\s+|,?\s*and\s+", words) if w]


@expert("click-checkboxes", "click-checkboxes-large", "click-checkboxes-transfer", kind="click")
def _click_checkboxes(p):
    targets = _checkbox_targets(p.utterance)
    goal = ("The task is to select " + (", ".join(f"\"{t}\"" for t in targets) or "nothing") + " and click Submit.")
    labels = p.q("[id^=boxes] label")          # #boxes, or #boxes-left + #boxes-right
    boxes = p.q("[id^=boxes] label input")
    for lab, box in zip(labels, boxes):
        want = lab.text in targets
        if want != box.checked:
            verb = "check" if want else "uncheck"
            return goal, click(box, f"the \"{lab.text}\" checkbox",
                               f"\"{lab.text}\" should be {verb}ed, so I click its box.", also=(lab,))
    return goal, click(_submit(p), "the \"Submit\" button", "The right boxes are checked, so I submit.")


@expert("focus-text", kind="click")
def _focus_text(p):
    return "The task is to focus the textbox.", click(p.one("#tt"), "the textbox", "I click into the textbox.")


@expert("focus-text-2", kind="click")
def _focus_text_2(p):
    n = int(p.match(r"Focus into the (\d+)").group(1))
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
    return (f"The task is to focus the {ordinal} textbox.",
            click(p.one(f"#tt{n}"), f"the {ordinal} textbox", f"I click into the {ordinal} textbox from the top."))


@expert("grid-coordinate", kind="click")
def _grid(p):
    m = p.match(r"\((-?\d+),\s*(-?\d+)\)")
    xy = f"({m.group(1)},{m.group(2)})"
    el = next((e for e in p.q("circle") if e.id == xy and e.visible), None)
    if el is None:
        raise ExpertError(f"no grid point {xy}")
    return (f"The task is to click the grid point {xy}.",
            click(el, f"the grid point {xy}", "I count along the axes from the centre (0,0) and click that point."))


@expert("identify-shape", kind="click")
def _identify_shape(p):
    first = p.js("var e = document.querySelector('#area_svg').firstElementChild;"
                 "return e ? [e.tagName.toLowerCase(), (e.textContent || '').trim()] : null;")
    if first is None:
        raise ExpertError("no figure")
    tag, text = first
    if tag == "text":
        dtype = "digit" if text.isdigit() else "letter"
    else:
        dtype = {"circle": "circle", "rect": "rectangle", "polygon": "triangle"}.get(tag)
        if dtype is None:
            raise ExpertError(f"unknown figure <{tag}>")
    btn = p.one(f'button[data-type="{dtype}"]')
    return ("The task is to name the figure with a button.",
            click(btn, f"the \"{btn.text}\" button", f"The figure is a {dtype if dtype != 'digit' else 'number'}, "
                                                     f"so I click \"{btn.text}\"."))


@expert("navigate-tree", kind="click")
def _navigate_tree(p):
    name = p.quoted()
    goal = f"The task is to click the file or folder named \"{name}\"."
    for e in p.q("#tree span"):
        if e.text == name and e.visible:
            return goal, click(e, f"\"{name}\" in the tree", "It is visible in the tree, so I click it.")
    path = p.env.browser.js("""
      var want = arguments[0], hit = null;
      document.querySelectorAll('#tree span').forEach(function (s) { if (!hit && s.textContent.trim() === want) hit = s; });
      if (!hit) return null;
      var names = [], li = hit.parentElement.parentElement.closest('li');
      while (li) { var s = li.querySelector(':scope > span'); if (s) names.unshift(s.textContent.trim());
                   li = li.parentElement.closest('li'); }
      return names;""", name)
    if not path:
        raise ExpertError(f"{name!r} is not in the tree")
    for folder in path:
        el = next((e for e in p.q("#tree span.folder") if e.text == folder and e.visible), None)
        if el is not None:
            opened = p.env.browser.js("var r = null; document.querySelectorAll('#tree span.folder').forEach("
                                      "function (s) { if (s.textContent.trim() === arguments[0]) r = s; });"
                                      "return r && r.parentElement.classList.contains('collapsable');", folder)
            if not opened:
                return goal, click(el, f"the folder \"{folder}\"", f"\"{name}\" is inside the folder \"{folder}\", "
                                                                    f"so I open it.")
    raise ExpertError(f"cannot reach {name!r} through {path}")


def _hidden_link(p: Page, containers: str) -> tuple[str, int | None]:
    """(link text, index of the container holding a matching link, or None if visible)."""
    name = p.quoted()
    for e in p.q("span.alink"):
        if e.text == name and e.visible:
            return name, None
    idx = p.env.browser.js(f"""
      var want = arguments[0], cs = document.querySelectorAll('{containers}');
      for (var i = 0; i < cs.length; i++) {{
        var links = cs[i].querySelectorAll('span.alink');
        for (var j = 0; j < links.length; j++) if (links[j].textContent.trim() === want) return i;
      }}
      return -1;""", name)
    if idx < 0:
        raise ExpertError(f"no link {name!r}")
    return name, idx


@expert("click-collapsible-2", "click-tab-2", kind="click")
def _click_hidden_link(p):
    """The link is in one of several sections (accordion headers) or tabs: open its own."""
    name, idx = _hidden_link(p, "#area > div")
    goal = f"The task is to find and click the link \"{name}\"."
    if idx is None:
        return goal, click(p.one("span.alink", text=name), f"the link \"{name}\"", "The link is visible, so I click it.")
    if p.env.task == "click-tab-2":
        tab = p.q("a.ui-tabs-anchor")[idx]
        return goal, click(tab, f"the \"{tab.text}\" tab", f"The link is on \"{tab.text}\", so I open that tab.")
    header = p.q("#area > h3")[idx]
    return goal, click(header, f"the \"{header.text}\" header", f"The link is in \"{header.text}\", so I expand it.")


@expert("enter-text", "enter-text-dynamic", kind="type")
def _enter_text(p):
    text = p.quoted()
    return _fill(p, [("#tt", text, "text")], f"The task is to enter \"{text}\" and submit.")


@expert("enter-text-2", kind="type")
def _enter_text_2(p):
    text = p.quoted()
    text = text.upper() if "upper case" in p.utterance else text.lower()
    return _fill(p, [("#tt", text, "text")], f"The task is to enter \"{text}\" and submit.")


@expert("enter-password", kind="type")
def _enter_password(p):
    pw = p.quoted()
    return _fill(p, [("#password", pw, "password"), ("#verify", pw, "verify password")],
                 f"The task is to enter the password \"{pw}\" twice and submit.")


@expert("login-user", "login-user-popup", kind="type")
def _login(p):
    user, pw = re.findall(r'"([^"]*)"', p.utterance)[:2]
    goal = f"The task is to log in as \"{user}\" with password \"{pw}\"."
    popup = [e for e in p.q("#popup-cancel") if e.visible]
    if popup:
        return goal, click(popup[0], "the popup's \"Cancel\" button",
                           "A popup asks to leave the page; I cancel it to stay.")
    return _fill(p, [("#username", user, "username"), ("#password", pw, "password")], goal,
                 button=_submit_label(p))


def _submit_label(p: Page) -> str:
    return next((e.text for e in p.q("#subbtn") if e.visible), "Login")


@expert("simple-arithmetic", kind="type")
def _arithmetic(p):
    prob = p.one("#math-problem").text
    m = re.match(r"\s*(-?\d+)\s*([-+x*])\s*(-?\d+)\s*=", prob)
    if not m:
        raise ExpertError(f"cannot read the problem {prob!r}")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    ans = str(a + b if op == "+" else a - b if op == "-" else a * b)
    return _fill(p, [("#math-answer", ans, "answer")], f"The task is to solve {prob} {ans} and type the answer.")


_ORD = re.compile(r"(\d+)(?:st|nd|rd|th)")


@expert("find-word", kind="type")
def _find_word(p):
    n = int(p.match(r"Find the (\d+)").group(1))
    words = p.one("#area p").text.split()
    if n > len(words):
        raise ExpertError("paragraph too short")
    word = re.sub(r"[^a-zA-Z]", "", words[n - 1])
    return _fill(p, [("#answer-input", word, "answer")],
                 f"The task is to type word number {n} of the paragraph; it is \"{word}\".")


@expert("read-table", kind="type")
def _read_table(p):
    key = p.match(r"Enter the value of (.*) into the text field").group(1)
    cells = p.q("#tab td")
    value = next((cells[i + 1].text for i in range(0, len(cells) - 1, 2) if cells[i].text == key), None)
    if value is None:
        raise ExpertError(f"no row {key!r}")
    return _fill(p, [("#tt", value, "text")], f"The task is to type the table's {key}; the table says \"{value}\".")


@expert("copy-paste", kind="type")
def _copy_paste(p):
    text = p.one("#to-copy").value or ""
    return _fill(p, [("#answer-input", text, "answer")], "The task is to copy the textarea's text into the textbox.")


@expert("choose-list", kind="select")
def _choose_list(p):
    name = p.match(r"Select (.*) from the list").group(1)
    goal = f"The task is to select \"{name}\" from the list and submit."
    sel = p.one("#options")
    if sel.selected != name:
        return goal, select(sel, name, "the list", f"The list does not show \"{name}\" yet, so I select it.")
    return goal, click(_submit(p), "the \"Submit\" button", f"\"{name}\" is selected, so I submit.")


@expert("form-sequence-3", kind="select")
def _form_sequence_3(p):
    m = p.match(r'Choose (.*) from the dropdown, then click the button labeled "(.*)"\.')
    option, button = m.group(1), m.group(2)
    goal = f"The task is to choose \"{option}\" in the dropdown, then click \"{button}\"."
    if p.js("return $('#dropdown').val();") != option:
        box = p.one(".selectric")
        return goal, select(box, option, "the dropdown", f"The dropdown does not show \"{option}\" yet, so I select it.")
    return goal, click(p.one("#buttons button", text=button), f"the \"{button}\" button",
                       f"\"{option}\" is chosen, so I click \"{button}\".")


# The task set: ordered, with their kind.
TASKS: tuple[str, ...] = tuple(EXPERTS)


def expert_step(env) -> ExpertStep:
    """The expert's next step for ``env`` (a :class:`MiniWobEnv`) in its current state."""
    fn = EXPERTS.get(env.task)
    if fn is None:
        raise ExpertError(f"no expert for MiniWoB++ task {env.task!r}; tasks with one: {sorted(EXPERTS)}")
    goal, plan = fn(Page(env))
    return to_step(plan, goal)
