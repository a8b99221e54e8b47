"""launch.merge / train.merge: averaging and TIES against hand-computed tensors and
transformers' own state dicts; the merged folder loads in transformers with the logits
of our loader; inputs of different architectures are one-line user errors."""
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file

from guilibra_jax.errors import UserError
from guilibra_jax.models import get_rope_index, load_hf
from guilibra_jax.train import merge as MG
from hf_fixtures import build_hf, make_batch, text_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _save(model, path):
  model.save_pretrained(path)
  return str(path)


def _tensors(folder):
  return load_file(os.path.join(folder, "model.safetensors"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """name -> HF folder: base (seed 0), a and b (other seeds), and models of other shapes."""
  root = tmp_path_factory.mktemp("merge")
  out = {name: _save(build_hf("qwen2_5_vl", seed=seed), root / name) for name, seed in
         (("base", 0), ("a", 1), ("b", 2))}
  out["vocab"] = _save(build_hf("qwen2_5_vl", seed=3, text=dict(vocab_size=320)), root / "vocab")
  out["mlp"] = _save(build_hf("qwen2_5_vl", seed=4, text=dict(intermediate_size=128)), root / "mlp")
  out["qwen3"] = _save(build_hf("qwen3_vl", seed=5), root / "qwen3")
  return out


# ----------------------------------------------------------------------------- pure merges

def test_ties_equals_the_hand_computed_merge():
  base = np.ones(4, np.float32)
  taus = [np.array([3, -1, 0.5, 2]), np.array([-4, 1, 0.2, 1]), np.array([1, -2, 0.1, -3])]
  xs = [(base + t).astype(np.float32) for t in taus]
  # density 0.5 keeps 2 of 4: [3,0,0,2], [-4,1,0,0] (|1| at index 1 before index 3), [0,-2,0,-3];
  # summed mass [-1,-1,0,-1] elects -,-,0,-; the agreeing means are -4, -2, (none), -3.
  np.testing.assert_array_equal(MG.ties_tensors(xs, base, density=0.5), base + np.array([-4, -2, 0, -3]))
  # weights 1,2,1: mass [-5, 0, 0, -1]: index 0 is -4 alone, index 1 has no elected sign
  np.testing.assert_array_equal(MG.ties_tensors(xs, base, density=0.5, weights=[1, 2, 1]),
                                base + np.array([-4, 0, 0, -3]))
  # density 1 keeps everything: index 0 mass -> -, mean of the negatives only (not the count majority)
  np.testing.assert_allclose(MG.ties_tensors([base + 1, base + 1, base - 5], base, density=1.0), base - 5)
  # a weighted disjoint mean: both agree -> (1*2 + 3*4) / 4
  np.testing.assert_allclose(MG.ties_tensors([base + 2, base + 4], base, density=1.0, weights=[1, 3]), base + 3.5)


def test_task_arithmetic_equals_the_hand_computed_merge():
  base = np.ones(3, np.float32)
  xs = [base + 2, base + np.array([4, 0, -4], np.float32)]
  # weights 1, 3 normalised: mean task vector [3.5, 0.5, -2.5]; scale 2 doubles it
  np.testing.assert_array_equal(MG.task_arithmetic_tensors(xs, base, 2.0, [1, 3]), base + np.array([7, 1, -5]))
  np.testing.assert_allclose(MG.task_arithmetic_tensors(xs, base, 1.0), MG.average_tensors(xs), rtol=0, atol=1e-6)
  np.testing.assert_array_equal(MG.task_arithmetic_tensors([base + 2], base, 3.0), base + 6)
  with pytest.raises(UserError, match="--scale"):
    MG.task_arithmetic_tensors(xs, base, 0.0)


def test_trim_keeps_the_largest_magnitudes_per_tensor():
  t = np.array([[0.1, -5.0, 2.0], [-3.0, 0.0, 1.0]])
  np.testing.assert_array_equal(MG.trim(t, 0.5), [[0, -5.0, 2.0], [-3.0, 0, 0]])
  np.testing.assert_array_equal(MG.trim(t, 0.01), [[0, -5.0, 0], [0, 0, 0]])   # at least one entry


def test_average_of_identical_tensors_is_bitwise_the_tensor():
  rng = np.random.default_rng(0)
  for dtype in (np.float32, jnp.bfloat16):
    x = rng.standard_normal((7, 5)).astype(dtype)
    for w in (None, [0.2, 0.3, 0.5], [1, 1, 7]):
      out = MG.average_tensors([x, x.copy(), x.copy()], w)
      assert out.dtype == x.dtype and out.tobytes() == x.tobytes()
  np.testing.assert_allclose(MG.average_tensors([np.zeros(3), np.ones(3)], [1, 3]), 0.75)


def test_bad_weights_and_density_are_user_errors():
  with pytest.raises(UserError, match="2 values for 3 inputs"):
    MG.average_tensors([np.zeros(2)] * 3, [1, 2])
  with pytest.raises(UserError, match="ties_density"):
    MG.ties_tensors([np.zeros(2)] * 2, np.zeros(2), density=0.0)


# ----------------------------------------------------------------------------- folders

def test_average_of_identical_folders_is_the_model_bitwise(folders, tmp_path):
  out = MG.merge_folders("average", [folders["a"]] * 3, str(tmp_path / "avg"), weights=[0.2, 0.3, 0.5])
  got, want = _tensors(out), _tensors(folders["a"])
  assert sorted(got) == sorted(want)
  for k in want:
    assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), k


def _torch_logits(model, ids, mask, positions):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("method", ["average", "task_arithmetic", "ties"])
def test_merged_folder_loads_in_transformers_with_our_loaders_logits(folders, tmp_path, method):
  from transformers import AutoModelForImageTextToText
  kw = {"average": dict(weights=[0.25, 0.75]), "task_arithmetic": dict(base=folders["base"], scale=2.0),
        "ties": dict(base=folders["base"], density=0.3)}[method]
  out = MG.merge_folders(method, [folders["a"], folders["b"]], str(tmp_path / method), **kw)
  # the tensors against transformers' own state dicts (merged here with torch ops)
  sd = [AutoModelForImageTextToText.from_pretrained(folders[n]).state_dict() for n in ("a", "b", "base")]
  theirs = AutoModelForImageTextToText.from_pretrained(out).eval()
  merged = theirs.state_dict()
  name = "model.language_model.layers.0.mlp.up_proj.weight"
  a, b, base = (s[name].double().numpy() for s in sd)
  if method == "average":
    want = 0.25 * a + 0.75 * b
  elif method == "task_arithmetic":
    want = base + 2.0 * (0.5 * (a - base) + 0.5 * (b - base))
  else:   # TIES with torch.topk trimming: an independent route to the same numbers
    taus = []
    for x in (a, b):
      t = torch.tensor(x - base).flatten()
      keep = torch.topk(t.abs(), round(0.3 * t.numel())).indices
      tt = torch.zeros_like(t)
      tt[keep] = t[keep]
      taus.append(tt.numpy().reshape(a.shape))
    sign = np.sign(taus[0] + taus[1])
    agree = [(np.sign(t) == sign) & (t != 0) for t in taus]
    num, den = sum(t * g for t, g in zip(taus, agree)), sum(g.astype(float) for g in agree)
    want = base + np.where(den > 0, num / np.maximum(den, 1), 0)
  np.testing.assert_allclose(merged[name].double().numpy(), want, rtol=0, atol=1e-6)
  # the same logits from transformers and from our loader
  ours, config = load_hf(out)
  ids, mask, _, _, _ = make_batch([text_tokens(9, 1), text_tokens(5, 2)])
  positions, _ = get_rope_index(ids, mask, None, config)
  ref = _torch_logits(theirs, ids, mask, positions)
  got = np.asarray(nnx.jit(lambda m, *a: m(*a))(ours, jnp.asarray(ids, jnp.int32), jnp.asarray(positions),
                                                jnp.asarray(mask, jnp.int32), None, None))
  real = mask.astype(bool)
  assert np.abs(got - ref)[real].max() <= 1e-5 * np.abs(ref[real]).max()
  assert os.path.exists(os.path.join(out, MG.MERGE_FILE))


@pytest.mark.parametrize("other,message", [
    ("vocab", r"tensor .*embed.* has shape \(300, 64\) in --inputs .*/a but \(320, 64\) in --inputs .*/vocab: "
              r"the inputs have different vocabularies"),
    ("mlp", r"tensor .*mlp.* has shape .* in --inputs .*/a but .* in --inputs .*/mlp: the inputs are not one "
            r"architecture"),
    ("qwen3", r"--inputs .*/a is a qwen2_5_vl model but --inputs .*/qwen3 is a qwen3_vl model"),
])
def test_mismatched_inputs_are_user_errors_naming_the_tensor_and_inputs(folders, tmp_path, other, message):
  with pytest.raises(UserError, match=message):
    MG.merge_folders("average", [folders["a"], folders[other]], str(tmp_path / "x"))


def test_ties_without_base_and_a_wrong_base_are_user_errors(folders, tmp_path):
  with pytest.raises(UserError, match="needs --base"):
    MG.merge_folders("ties", [folders["a"], folders["b"]], str(tmp_path / "x"))
  with pytest.raises(UserError, match=r"in --base .*/vocab: the inputs have different vocabularies"):
    MG.merge_folders("ties", [folders["a"], folders["b"]], str(tmp_path / "x"), base=folders["vocab"])
  with pytest.raises(UserError, match="neither a Hugging Face folder"):
    MG.merge_folders("average", [folders["a"], str(tmp_path)], str(tmp_path / "x"))


def test_launcher_reports_a_mismatch_on_one_line(folders, tmp_path):
  r = subprocess.run([sys.executable, "-m", "launch.merge", "--method=average",
                      f"--inputs={folders['a']},{folders['vocab']}", f"--out={tmp_path / 'x'}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
  assert len(lines) == 1 and "different vocabularies" in lines[0] and "Traceback" not in r.stderr
