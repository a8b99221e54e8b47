"""Copy variants (guilibra_jax/data/copy_variants.py) on hand-written MiniWoB-like steps."""

import json

import pytest

from guilibra_jax import actions as A
from guilibra_jax.data import copy_variants as CV
from guilibra_jax.data.native import StepRecord, StepTarget, record_from_dict


def _step(instruction, value, desc, history=(), reasoning=None, step=0, tid="enter-text-3", action="Write",
          tool_call=None):
    return StepRecord(tid, step, "web", instruction, tuple(history), "img.png", (320, 420),
                      StepTarget(action, desc, value, (0.5, 0.4), (0.4, 0.3, 0.6, 0.5), None, "the text field",
                                 tool_call),
                      reasoning, (StepTarget(action, desc, value, (0.5, 0.45)),), "miniwob/enter-text")


def test_swaps_every_occurrence_and_keeps_the_step_consistent():
    r = _step('Enter "Kasie" into the text field and press Submit.', "Kasie", 'Type "Kasie" into the text field',
              reasoning='The task is to enter "Kasie" and submit. The field does not hold "Kasie" yet.')
    (v,) = CV.copy_variants(r, 1, seed=0, pool=["Jerald", "Kasie"], random_fraction=0.0)
    assert v.instruction == 'Enter "Jerald" into the text field and press Submit.'
    assert v.target.value == "Jerald" and v.alternatives[0].value == "Jerald"
    assert v.target.action_description == 'Type "Jerald" into the text field'
    assert v.reasoning.count('"Jerald"') == 2 and "Kasie" not in v.reasoning
    assert v.trajectory_id == "enter-text-3~copy0"
    assert (v.image, v.target.point, v.target.bbox, v.step) == (r.image, r.target.point, r.target.bbox, r.step)
    # a native record again, as written to JSONL
    assert record_from_dict(json.loads(v.to_json())) == v


def test_random_strings_keep_the_shape_and_differ():
    r = _step('Log in with username "ab12" and password "tCXT".', "tCXT", 'Type "tCXT" into the password field',
              history=('Type "ab12" into the username field',), tid="login-user-7", step=1)
    vs = CV.copy_variants(r, 5, seed=3, random_fraction=1.0)
    assert len(vs) == 5 and len({v.target.value for v in vs}) > 1
    for v in vs:
        user, pw = CV.quoted_strings(v.instruction)
        assert pw == v.target.value != "tCXT"
        assert [c.isupper() for c in pw] == [c.isupper() for c in "tCXT"]
        assert user[2:].isdigit() and user[:2].islower() and user != "ab12"
        assert v.history == (f'Type "{user}" into the username field',)


def test_case_forms_follow_the_swap():
    r = _step('Type "Kasie" in all upper case letters in the text field.', "KASIE", 'Type "KASIE" into the text field')
    for v in CV.copy_variants(r, 4, seed=1, pool=["lorem", "Jerald", "IPSUM"], random_fraction=0.5):
        (new,) = CV.quoted_strings(v.instruction)
        assert v.target.value == new.upper() and new.upper() != "KASIE"
        assert v.target.action_description == f'Type "{new.upper()}" into the text field'


def test_steps_of_one_episode_swap_alike_and_the_seed_matters():
    ins = 'Enter "Kasie" into the text field.'
    a = _step(ins, "Kasie", 'Type "Kasie" into the text field', step=0)
    b = _step(ins, "Kasie", 'Type "Kasie" into the text field', step=1, history=('Click the text field',))
    pool = ["Jerald", "Nora", "Lisa", "Tom"]
    va, vb = (CV.copy_variants(x, 3, seed=0, pool=pool) for x in (a, b))
    assert [v.instruction for v in va] == [v.instruction for v in vb]
    others = [CV.copy_variants(a, 3, seed=s, pool=pool) for s in range(1, 6)]
    assert any([v.instruction for v in o] != [v.instruction for v in va] for o in others)


def test_whole_words_only():
    r = _step('Enter "an" into the field, then press Submit and an Enter.', "an", 'Type "an" into the field')
    (v,) = CV.copy_variants(r, 1, seed=0, pool=["xy"], random_fraction=0.0)
    assert v.instruction == 'Enter "xy" into the field, then press Submit and xy Enter.'   # "and", "Enter" kept


@pytest.mark.parametrize("instruction,value,why", [
    ('Click the "OK" button.', None, "no_value"),
    ("Enter the value of the table's cell.", "42", "no_quoted_string"),
    ('Enter the value of "Color" from the table.', "red", "value_not_quoted"),
    ('Enter "a" into the field.', "a", "short_quoted_string"),
])
def test_steps_that_do_not_copy_have_no_variants(instruction, value, why):
    r = _step(instruction, value, "d", action="Click" if value is None else "Write")
    assert CV.eligible(r) == why
    assert CV.copy_variants(r, 3, seed=0, pool=["xyz"]) == []


def test_tool_call_arguments_are_swapped():
    call = A.ToolCall("computer_use", {"action": "type", "text": "Kasie"})
    r = _step('Enter "Kasie".', "Kasie", 'Type "Kasie"', tool_call=call)
    (v,) = CV.copy_variants(r, 1, seed=0, pool=["Nora"], random_fraction=0.0)
    assert v.target.tool_call.arguments == {"action": "type", "text": "Nora"}


def test_launcher_writes_only_variants_and_reports_what_it_skipped(tmp_path):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"png")
    copy = _step('Enter "Kasie" into the text field.', "Kasie", 'Type "Kasie" into the text field')
    click = _step('Click the "OK" button.', None, 'Click the "OK" button', action="Click", tid="click-button-1")
    lines = [json.dumps({**r.to_dict(), "image": "images/a.png"}) for r in (copy, click)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines[:1] + ['{"step": -1}'] + lines[1:]) + "\n")
    env = {**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-m", "launch.copy_variants", f"--input={tmp_path}/train.jsonl",
                          f"--out={tmp_path}/train_copy.jsonl", "--copies=2"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["steps_read"], got["eligible"], got["variants"]) == (3, 1, 2)
    assert got["not_eligible"] == {"no_value": 1} and sum(got["bad_records"].values()) == 1
    assert "train.jsonl:2" in got["bad_examples"][0]
    rows = [json.loads(x) for x in (tmp_path / "train_copy.jsonl").read_text().splitlines()]
    assert [r["trajectory_id"] for r in rows] == ["enter-text-3~copy0", "enter-text-3~copy1"]
    assert all(r["image"] == "images/a.png" and r["target"]["value"] != "Kasie" for r in rows)
    assert all(f'"{r["target"]["value"]}"' in r["instruction"] for r in rows)


def test_demo_tokenizer_spells_quoted_strings_from_pieces(tmp_path):
    """data.synthetic.tokenizer_spell_quoted: the names a typing task copies get no merges of
    their own, so each is several tokens of the template's pieces; without it the BPE keeps
    a frequent name whole. Other text (the template) tokenises as before."""
    from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer, demo_corpus
    names = ["Kasie", "Jerald", "Emile", "Marybeth"]
    records = [_step(f'Enter "{n}" into the text field and press Submit.', n, f'Type "{n}" into the text field',
                     tid=f"enter-text-{i}") for i in range(40) for n in names]
    whole = build_demo_tokenizer(demo_corpus(records, "qwen2_5_vl", ("guilibra",)), 1024, str(tmp_path / "a"))
    spelled = build_demo_tokenizer(demo_corpus(records, "qwen2_5_vl", ("guilibra",), spell_quoted=True), 1024,
                                   str(tmp_path / "b"))
    for n in names:
        assert n in whole.tokenize(f'"{n}"')                           # one token of its own
        pieces = spelled.tokenize(f'"{n}"')
        assert len(pieces) >= 4 and not any(n.lower() in p.lower() for p in spelled.get_vocab())
        assert spelled.convert_tokens_to_string(pieces) == f'"{n}"'
    template = "into the text field and press Submit."
    assert len(spelled.tokenize(template)) == len(whole.tokenize(template))
