"""launch.study --smoke: every stage of a study runs for a couple of steps; the report's
numbers are the eval stages' own episodes (Wilson intervals recounted here); a rerun
skips finished stages and resumes an interrupted training stage from its checkpoint."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from guilibra_jax.eval.stats import spearman, wilson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
  """One compilation cache for the module's studies: their stages share programs."""
  return str(tmp_path_factory.mktemp("xla_cache"))


def _study(study, workdir, cache, *extra):
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "JAX_PLATFORMS": "cpu",
         "JAX_COMPILATION_CACHE_DIR": cache}
  r = subprocess.run([sys.executable, "-m", "launch.study", f"--study={study}", f"--workdir={workdir}", "--smoke",
                      *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stderr[-4000:]
  return r


def _log(workdir):
  with open(os.path.join(workdir, "study_log.jsonl")) as f:
    return [json.loads(line)["stage"] for line in f]


def _online_counts(eval_dir, entry="checkpoint"):
  """(successes, episodes) per platform, counted from the eval's per-episode file."""
  with open(os.path.join(eval_dir, f"online_{entry}.json")) as f:
    episodes = json.load(f)["episodes"]
  out = {}
  for e in episodes:
    k, n = out.get(e["platform"], (0, 0))
    out[e["platform"]] = (k + int(bool(e["success"])), n + 1)
  return out


@pytest.mark.slow   # minutes of compiles; the merge, report and stage-config tests cover the pieces in the default run
def test_mopd_study_smoke_runs_every_stage_reports_and_resumes(tmp_path, xla_cache):
  from configs import study_mopd as S
  wd = str(tmp_path / "mopd")
  _study("mopd", wd, xla_cache)
  stages = [s["name"] for s in S.plan(wd, smoke=True)]
  assert _log(wd) == stages
  with open(os.path.join(wd, "results.json")) as f:
    res = json.load(f)
  assert set(res["models"]) == set(S.MODELS)
  for m in S.MODELS:
    for p, (k, n) in _online_counts(os.path.join(wd, f"eval_{m}")).items():
      row = res["models"][m][p]
      assert (row["successes"], row["episodes"]) == (k, n) and row["ci95"] == list(wilson(k, n))
  assert res["paper"]["mopd"] == {"desktop": 38.2, "mobile": 12.0}
  report = open(os.path.join(wd, "report.md")).read()
  assert "| merge_ties |" in report and "| teacher_mobile_wide |" in report
  assert len(res["orderings"]["mopd"]) == 2 * 15             # every pair of the paper's 6 rows, per platform
  assert "## The paper's orderings, with mopd_2x as UI-MOPD" in report
  for png in res["figures"].values():
    assert os.path.getsize(os.path.join(wd, png)) > 1000
  with open(os.path.join(wd, "merge_ties", "merge.json")) as f:
    assert json.load(f)["base"] == os.path.join(wd, "base")
  # a rerun skips every finished stage; an interrupted MOPD stage (no export, no marker) resumes
  shutil.rmtree(os.path.join(wd, "mopd_long", "export"))
  os.remove(os.path.join(wd, "mopd_long", "study_stage.json"))
  # a workdir without an export merges from its latest checkpoint (launch.merge, as a user would)
  merged = str(tmp_path / "merged")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
  m = subprocess.run([sys.executable, "-m", "launch.merge", "--method=average",
                      f"--inputs={wd}/mopd_long,{wd}/base/export", f"--out={merged}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert m.returncode == 0, m.stderr[-3000:]
  r = _study("mopd", wd, xla_cache)
  assert _log(wd) == stages + ["mopd_long"]
  assert "resum" in r.stderr.lower() and os.path.exists(os.path.join(wd, "mopd_long", "export", "config.json"))
  import numpy as np
  from safetensors.numpy import load_file
  got, a, b = (load_file(os.path.join(d, "model.safetensors"))
               for d in (merged, f"{wd}/mopd_long/export", f"{wd}/base/export"))
  assert sorted(got) == sorted(a)
  for k in a:   # the checkpoint the rerun exported, averaged with the base
    np.testing.assert_allclose(got[k], 0.5 * (a[k].astype(np.float64) + b[k]), rtol=0, atol=1e-6)
  for f in ("tokenizer.json", "run_config.json", "generation_config.json", "preprocessor_config.json"):
    assert os.path.exists(os.path.join(merged, f)), f


def test_mopd_orderings_are_paired_by_seed_against_the_papers_table(tmp_path):
  """Every pair of the paper's rows per platform, tested on the same seeds: a model that
  wins every seed the other loses "holds"; identical outcomes are a "tie"; the paper's
  "teachers" row is each platform's wide teacher; reversing a pair is "reversed, significant"."""
  from configs import study_mopd as S
  from guilibra_jax.eval.study_report import orderings
  root = str(tmp_path)
  rank = {"base": 0, "mixed_sft": 1, "merge_average": 2, "merge_ties": 2, "mopd": 4, "teachers": 5}
  models = {"base", "mixed_sft", "merge_average", "merge_ties", "mopd", *S.TEACHERS}
  for m in models:     # success on seeds < 8 * rank: a higher rank wins a superset of seeds
    r = rank["teachers" if m in S.TEACHERS else m]
    os.makedirs(os.path.join(root, f"eval_{m}"))
    with open(os.path.join(root, f"eval_{m}", "online_checkpoint.json"), "w") as f:
      json.dump({"episodes": [{"platform": p, "seed": k, "success": k < 8 * r} for p in S.PLATFORMS
                              for k in range(80)]}, f)
  o = orderings(root, S)
  assert len(o) == 2 * 15 and {x["platform"] for x in o} == set(S.PLATFORMS)
  by = {(x["platform"], x["higher"], x["lower"]): x for x in o}
  x = by[("desktop", "teachers", "mopd")]
  assert x["models"] == ["teacher_desktop_wide", "mopd"] and x["verdict"] == "holds"
  assert x["difference"] == pytest.approx(8 / 80) and x["episodes"] == 80
  assert by[("mobile", "teachers", "mopd")]["models"][0] == "teacher_mobile_wide"
  assert by[("desktop", "merge_ties", "merge_average")]["verdict"] == "tie"
  x = by[("mobile", "base", "mixed_sft")]             # the paper: base 7.7 > mixed SFT 6.4 on mobile
  assert x["verdict"] == "reversed, significant" and x["difference"] == pytest.approx(-8 / 80)


@pytest.mark.slow   # ~2.5 min of CPU: the mopd smoke covers the driver, the report test below this report
def test_guilibra_study_smoke_reports_every_arm(tmp_path, xla_cache):
  from configs import study_guilibra as S
  wd = str(tmp_path / "guilibra")
  _study("guilibra", wd, xla_cache)
  assert _log(wd) == [s["name"] for s in S.plan(wd, smoke=True)]
  with open(os.path.join(wd, "results.json")) as f:
    res = json.load(f)
  assert set(res["asft"]) == set(S.SFT) and set(res["grpo"]) == set(S.GRPO)
  for arm, r in res["grpo"].items():
    steps = [c["step"] for c in r["checkpoints"]]
    n = S.get_config(arm, wd, smoke=True).train.steps
    assert steps == list(range(n + 1)), (arm, steps)   # the SFT start, then every kept checkpoint
    off = [c["overall"]["offline_step_success"] for c in r["checkpoints"]]
    on = [c["overall"]["success_rate"] for c in r["checkpoints"]]
    assert r["spearman_offline_vs_online"] == spearman(off, on)
  assert res["predictability"]["draws"] > 0 and "beta > 0 keeps offline predictive" in " ".join(res["claims"])
  for png in res["figures"].values():
    assert os.path.getsize(os.path.join(wd, png)) > 1000


@pytest.mark.slow   # ~4 min of CPU: the distill report, config and workdir tests cover the pieces by default
def test_distill_study_smoke_sweeps_chooses_and_reports(tmp_path, xla_cache):
  from configs import study_distill as S
  wd = str(tmp_path / "distill")
  _study("distill", wd, xla_cache)
  stages = _log(wd)
  assert [s for s in stages if s.startswith("sweep_")] == [S.sweep_name(e, lr) for e, lr in S.SWEEP]
  assert stages.index("choose") < stages.index("distill_desktop") < stages.index("mopd")
  choice = json.load(open(os.path.join(wd, S.CHOSEN)))
  assert choice["arm"] in choice["arms"] and choice["arm"] == min(
      choice["arms"], key=lambda a: choice["arms"][a]["kl_last"])
  res = json.load(open(os.path.join(wd, "results.json")))
  assert set(S.MODELS) <= set(res["models"])
  _study("distill", wd, xla_cache)                     # a rerun resumes: every stage already done
  assert _log(wd) == stages


@pytest.mark.slow   # ~3 min of CPU: the grpo report, stage-config and synthetic online tests cover the pieces
def test_grpo_study_smoke_chooses_on_training_episodes_and_reports(tmp_path, xla_cache):
  from configs import study_grpo as S
  wd = str(tmp_path / "grpo")
  _study("grpo", wd, xla_cache)
  assert _log(wd) == [s["name"] for s in S.plan(wd, smoke=True)]
  choice = json.load(open(os.path.join(wd, S.CHOSEN)))
  assert choice["arm"] in S.ONLINE and set(choice["arms"]) == set(S.ONLINE)
  res = json.load(open(os.path.join(wd, "results.json")))
  assert set(res["models"]) == set(S.MODELS)


def test_grpo_report_from_eval_reports(tmp_path):
  """The GRPO report: the targets compare the arm chosen on training episodes with the SFT
  start (disjoint 95% intervals overall; offline drop); curves come from the runs' metrics."""
  import numpy as np
  from configs import study_grpo as S
  from guilibra_jax.eval.report import write_report
  from guilibra_jax.eval.study_report import grpo_report, scores
  rng = np.random.default_rng(2)
  root = str(tmp_path)
  entries = {m: _entry("checkpoint", rng) for m in S.MODELS}
  for m, e in entries.items():
    write_report(os.path.join(root, f"eval_{m}"), [e], connect=False)
  for m in S.MODELS[1:]:
    os.makedirs(os.path.join(root, m))
    with open(os.path.join(root, m, "metrics.jsonl"), "w") as f:
      for s in range(1, 31):
        f.write(json.dumps({"step": s, "reward_mean": s / 30, "kl": 0.01, "equal_reward_groups": 0.5,
                            "failed_groups": 0.25}) + "\n")
  for i, arm in enumerate(S.ONLINE):
    with open(os.path.join(root, arm, "online_episodes.jsonl"), "w") as f:
      for k in range(10):
        f.write(json.dumps({"task": "desktop", "seed": k, "success": k < 2 + 3 * i, "steps": 2}) + "\n")
  choice = S.choose(root)   # success 0.2, 0.5, 0.8, ... by arm: the last arm wins
  last = 2 + 3 * (len(S.ONLINE) - 1)
  assert last <= 10, "this test writes 10 episodes per arm"
  assert choice["arm"] == S.ONLINE[-1] and choice["arms"][S.ONLINE[-1]]["train_success"] == last / 10
  res = grpo_report(root, S)
  best, sft = scores(entries[choice["arm"]], S.PLATFORMS), scores(entries["sft"], S.PLATFORMS)
  key = f"{choice['arm']} online > sft overall, intervals disjoint"
  assert res["claims"][key] == ("yes" if best["overall"]["ci95"][0] > sft["overall"]["ci95"][1] else "no")
  first = S.ONLINE[0]
  assert res["runs"][first]["reward_mean"]["last"] == pytest.approx(np.mean([s / 30 for s in range(21, 31)]))
  assert res["runs"][first]["failed_groups"]["last"] == pytest.approx(0.25)
  assert f"| {first} |" in open(os.path.join(root, "report.md")).read()
  for m in set(S.MODELS[1:]) - set(S.ONLINE):    # follow-up arms and diagnostics: both targets, each
    r, start = scores(entries[m], S.PLATFORMS), S.STARTS.get(m, "sft")
    s0 = scores(entries[start], S.PLATFORMS)
    assert res["claims"][f"{m} online > {start} overall, intervals disjoint"] == (
      "yes" if r["overall"]["ci95"][0] > s0["overall"]["ci95"][1] else "no")
    assert sum(k.startswith(f"{m} offline step accuracy down by at most 0.02") for k in res["claims"]) == 1
  w = res["runs"][first]["training_episodes"]       # 10 episodes of 2 steps, 2 successes
  assert w["last"] == {"episodes": 10, "success": 0.2, "mean_steps": 2.0, "at_step_limit": 0.0}
  for i, arm in enumerate(S.ONLINE_LONG):           # the second choice, against its own start
    with open(os.path.join(root, arm, "online_episodes.jsonl"), "w") as f:
      for k in range(10):
        f.write(json.dumps({"task": "mobile", "seed": k, "success": k < 8 - 3 * i, "steps": 2}) + "\n")
  long = S.choose(root, S.ONLINE_LONG, S.CHOSEN_LONG)
  assert long["arm"] == S.ONLINE_LONG[0]
  res = grpo_report(root, S)
  start = S.STARTS[long["arm"]]
  assert start != "sft" and res["choice_long"]["arm"] == long["arm"]
  r, s0 = scores(entries[long["arm"]], S.PLATFORMS), scores(entries[start], S.PLATFORMS)
  assert res["claims"][f"{long['arm']} online > {start} overall, intervals disjoint"] == (
    "yes" if r["overall"]["ci95"][0] > s0["overall"]["ci95"][1] else "no")
  assert f"{long['arm']} online > sft overall, intervals disjoint" not in res["claims"]
  assert all(f"{long['arm']} online > {start} on {p}" in res["claims"] for p in S.PLATFORMS)
  assert res["confirm"] is None                     # the confirm stages have not run
  for stage, n in (("eval", 3), ("confirm", 6), ("confirm_large", 12)):   # both confirmations in the report
    for m, win in zip(S.CONFIRM, (lambda k: k % 3 == 0, lambda k: k % 2 == 0)):
      os.makedirs(os.path.join(root, f"{stage}_{m}"), exist_ok=True)
      with open(os.path.join(root, f"{stage}_{m}", "online_checkpoint.json"), "w") as f:
        json.dump({"episodes": [{"platform": p, "seed": k, "success": win(k)} for p in S.PLATFORMS
                                for k in range(n)]}, f)
  res = grpo_report(root, S)
  start, arm = S.CONFIRM
  assert res["confirm"]["seen"] == 2 * 3 and res["confirm_large"]["seen"] == 2 * 6
  assert res["confirm_large"]["overall"][arm]["episodes"] == 2 * 6
  assert f"{arm} - {start} on the large confirmation's fresh seeds (mobile), paired 95% interval above 0" in res["claims"]
  assert "## Large confirmation on fresh held-out seeds" in open(os.path.join(root, "report.md")).read()


def test_grpo_confirmation_uses_only_fresh_seeds_paired(tmp_path):
  """The confirmation leaves out every (platform, seed) an eval stage played (there the start
  wins every episode, so counting them would change the result) and pairs the rest by seed."""
  from configs import study_grpo as S
  from guilibra_jax.eval.study_report import confirm
  root = str(tmp_path)
  start, arm = S.CONFIRM

  def write(stage, seeds, win):
    os.makedirs(os.path.join(root, stage))
    eps = [{"platform": p, "seed": k, "success": win(p, k)} for p in S.PLATFORMS for k in seeds]
    with open(os.path.join(root, stage, "online_checkpoint.json"), "w") as f:
      json.dump({"episodes": eps}, f)

  assert confirm(root, S) is None
  write(f"eval_{start}", range(10), lambda p, k: True)
  write(f"eval_{arm}", range(10), lambda p, k: False)
  write(f"confirm_{start}", range(30), lambda p, k: k < 10 or 10 <= k < 15)   # fresh: 5 of 20
  assert confirm(root, S) is None                   # the arm's stage has not run
  write(f"confirm_{arm}", range(30), lambda p, k: 10 <= k < 25 if p == "desktop" else 10 <= k < 15)
  c = confirm(root, S)
  assert c["seen"] == 2 * 10
  d, m = c["desktop"], c["mobile"]
  assert d[start]["episodes"] == d[arm]["episodes"] == 20
  assert (d[start]["successes"], d[arm]["successes"]) == (5, 15)
  assert d["difference"]["mean"] == pytest.approx(0.5) and d["difference"]["ci95"][0] > 0
  assert m["difference"] == {"mean": 0.0, "ci95": [0.0, 0.0]}        # identical outcomes on every seed
  assert c["overall"][arm]["ci95"] == list(wilson(20, 40))
  assert c["overall"]["difference"]["mean"] == pytest.approx(0.25)
  # the large confirmation leaves out what the eval AND confirm stages played
  assert confirm(root, S, "confirm_large", ("eval", "confirm")) is None
  write(f"confirm_large_{start}", range(40), lambda p, k: k < 30)
  write(f"confirm_large_{arm}", range(40), lambda p, k: k >= 30)
  c = confirm(root, S, "confirm_large", ("eval", "confirm"))
  assert c["seen"] == 2 * 30
  assert c["overall"][start]["successes"] == 0 and c["overall"][arm]["successes"] == 20
  assert c["overall"]["difference"]["mean"] == pytest.approx(1.0)


def test_unknown_stage_is_a_one_line_error(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  r = subprocess.run([sys.executable, "-m", "launch.study", "--study=mopd", f"--workdir={tmp_path}", "--smoke",
                      "--stages=nope"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "error: --stages: ['nope'] are not stages of the mopd study" in r.stderr


@pytest.mark.parametrize("study", ["mopd", "guilibra", "distill", "grpo"])
def test_every_full_size_stage_config_validates(study, tmp_path):
  """The full-size stage configs (run once the folders of earlier stages exist) validate;
  stages refer only to folders of earlier stages of the plan."""
  import importlib

  from guilibra_jax.train import config as run_config
  module = importlib.import_module(f"configs.study_{study}")
  root = str(tmp_path)
  if study == "distill":     # the configs chosen by the sweep read its choice
    with open(os.path.join(root, module.CHOSEN), "w") as f:
      json.dump({"estimator": "logratio_advantage", "lr": 1e-3}, f)
  earlier = set()
  for stage in module.plan(root):
    refs = []
    if stage["kind"] == "call":
      earlier.add(stage["name"])
      continue
    if stage["kind"] == "train":
      c = stage["config"] = stage["config"]() if callable(stage["config"]) else stage["config"]
      refs = [c.model.hf_path, c.tokenizer.path, *dict(c.rl.teachers).values()]
    elif stage["kind"] == "merge":
      refs = [*stage["inputs"], stage.get("base", "")]
    else:
      k = stage["config"].agent_kwargs.checkpoint
      refs = [k.hf_path, k.workdir]
    for ref in filter(None, refs):
      assert os.path.relpath(ref, root).split(os.sep)[0] in earlier, (stage["name"], ref)
      os.makedirs(ref, exist_ok=True)
    if stage["kind"] == "train":
      run_config.validate(stage["config"])
    earlier.add(stage["name"])


def _entry(name, rng, series=None):
  """An evaluated model as eval.run passes it to the report (random scores)."""
  def off(n):
    return {"step_success": rng.random(), "grounding_accuracy": rng.random(), "action_type_accuracy": rng.random(),
            "n": n}
  plats = ("desktop", "mobile")
  k = {p: int(rng.integers(0, 11)) for p in plats}
  e = {"name": name, "offline": {"overall": off(40), "by_platform": {p: off(20) for p in plats}, "by_action_type": {}},
       "online": {"overall": {"episodes": 20, "success_rate": sum(k.values()) / 20},
                  "by_platform": {p: {"episodes": 10, "success_rate": k[p] / 10} for p in plats}}}
  return {**e, "series": series} if series else e


def _scored_entry(root, stage, name, rng, series=None, n_off=40, n_on=20):
  """An evaluated entry with its per-item outcomes written as eval.run writes them
  (offline_<name>.json steps, online_<name>.json episodes); the entry's rates follow them."""
  os.makedirs(os.path.join(root, stage), exist_ok=True)
  plats = ("desktop", "mobile")
  p_off, p_on = rng.random(), rng.random()
  steps = [{"trajectory_id": f"t{k}", "step": 0, "platform": plats[k % 2], "step_success": bool(rng.random() < p_off)}
           for k in range(n_off)]
  eps = [{"platform": plats[k % 2], "seed": k // 2, "success": bool(rng.random() < p_on)} for k in range(n_on)]
  with open(os.path.join(root, stage, f"offline_{name}.json"), "w") as f:
    json.dump({"steps": steps}, f)
  with open(os.path.join(root, stage, f"online_{name}.json"), "w") as f:
    json.dump({"episodes": eps}, f)

  def off(rows):
    return {"step_success": sum(r["step_success"] for r in rows) / len(rows), "grounding_accuracy": 0.5,
            "action_type_accuracy": 0.5, "n": len(rows)}

  def on(rows):
    return {"episodes": len(rows), "success_rate": sum(r["success"] for r in rows) / len(rows)}
  e = {"name": name,
       "offline": {"overall": off(steps), "by_platform": {p: off([r for r in steps if r["platform"] == p]) for p in plats},
                   "by_action_type": {}},
       "online": {"overall": on(eps), "by_platform": {p: on([r for r in eps if r["platform"] == p]) for p in plats}},
       "_steps": steps, "_episodes": eps}
  return {**e, "series": series} if series else e


def test_guilibra_report_from_eval_reports(tmp_path):
  """The GUI-Libra report reads the eval stages' files (written by eval.run / eval.report):
  each arm's points are the SFT start (step 0) then its checkpoints, Spearman as scipy's; the
  final checkpoint against the start paired by seed; the predictability claim as the
  difference of the beta > 0 and beta = 0 arms' mean rho."""
  import numpy as np
  stats = pytest.importorskip("scipy.stats")
  from configs import study_guilibra as S
  from guilibra_jax.eval.report import write_report
  from guilibra_jax.eval.study_report import guilibra_report

  def strip(e):
    return {k: v for k, v in e.items() if not k.startswith("_")}
  rng = np.random.default_rng(0)
  root = str(tmp_path)
  sft = {a: _scored_entry(root, f"eval_{a}", "checkpoint", rng) for a in S.SFT}
  for a, e in sft.items():
    write_report(os.path.join(root, f"eval_{a}"), [strip(e)], connect=False)
  arms = {}
  for arm in S.GRPO:
    arms[arm] = [_scored_entry(root, f"eval_{arm}", f"checkpoint@{s}", rng, "checkpoint") for s in (15, 30, 45, 60)]
    write_report(os.path.join(root, f"eval_{arm}"), [strip(e) for e in arms[arm]], connect=False)
    os.makedirs(os.path.join(root, arm))
    with open(os.path.join(root, arm, "metrics.jsonl"), "w") as f:
      for s in range(1, 61):
        f.write(json.dumps({"step": s, "reward_mean": s / 60, "kl": s / 600}) + "\n")
  res = guilibra_report(root, S)
  start = sft[S.START]
  rho = {}
  for arm, entries in arms.items():
    r = res["grpo"][arm]
    assert [c["step"] for c in r["checkpoints"]] == [0, 15, 30, 45, 60]
    off = [e["offline"]["overall"]["step_success"] for e in [start] + entries]
    on = [e["online"]["overall"]["success_rate"] for e in [start] + entries]
    rho[arm] = stats.spearmanr(off, on).statistic
    assert r["spearman_offline_vs_online"] == pytest.approx(rho[arm])
    assert r["final_kl"] == pytest.approx(0.1) and r["reward_first_last"] == pytest.approx([1 / 60, 1.0])
    assert r["final_vs_start_online"]["difference"] == pytest.approx(on[-1] - on[0])
    assert r["final_vs_start_offline"] == pytest.approx(off[-1] - off[0])
  pred = res["predictability"]
  pos = [a for a in S.GRPO if S.BETAS[a] > 0]
  neg = [a for a in S.GRPO if S.BETAS[a] == 0]
  assert pos and neg and pred["steps"] == 40 and pred["episodes"] == 20
  assert pred["difference"] == pytest.approx(np.mean([rho[a] for a in pos]) - np.mean([rho[a] for a in neg]))
  lo, hi = pred["ci95"]
  assert lo <= pred["difference"] <= hi
  k = round(sft["asft_a1g1"]["online"]["by_platform"]["mobile"]["success_rate"] * 10)
  assert res["asft"]["asft_a1g1"]["mobile"]["ci95"] == list(wilson(k, 10))
  report = open(os.path.join(root, "report.md")).read()
  assert "| asft_release |" in report and "## Predictability" in report
  for png in res["figures"].values():
    assert os.path.getsize(os.path.join(root, png)) > 1000


def test_distill_report_from_eval_reports(tmp_path):
  """The distillation report: the KL windows and the offline accuracy by checkpoint come
  from the runs' metrics and eval reports; the targets are ratios to the teachers'."""
  import numpy as np
  from configs import study_distill as S
  from guilibra_jax.eval.report import write_report
  from guilibra_jax.eval.study_report import distill_report
  rng = np.random.default_rng(1)
  root = str(tmp_path)
  entries = {m: _entry("checkpoint", rng) for m in S.MODELS}
  for m, e in entries.items():
    write_report(os.path.join(root, f"eval_{m}"), [e], connect=False)
  steps = [_entry(f"checkpoint@{s}", rng, "checkpoint") for s in (25, 50)]
  write_report(os.path.join(root, "eval_distill_desktop_steps"), steps, connect=False)
  for run, kl in (("distill_desktop", lambda s: 1.0 / s), *((a, lambda s: 0.5) for a in S.MOPD_ARMS)):
    os.makedirs(os.path.join(root, run))
    with open(os.path.join(root, run, "metrics.jsonl"), "w") as f:
      for s in range(1, 51):
        f.write(json.dumps({"step": s, "kl": kl(s)}) + "\n")
  arms = {S.sweep_name(e, lr): {"estimator": e, "lr": lr, "kl_first": 1.0, "kl_last": 0.1 * i}
          for i, (e, lr) in enumerate(S.SWEEP)}
  with open(os.path.join(root, S.CHOSEN), "w") as f:
    json.dump({"estimator": "k3", "lr": 1e-3, "arm": next(iter(arms)), "arms": arms}, f)
  res = distill_report(root, S)
  d = res["distill_desktop"]
  w = S.SWEEP_WINDOW
  assert d["kl_first_window"] == pytest.approx(np.mean([1.0 / s for s in range(1, w + 1)]))
  assert d["kl_last_window"] == pytest.approx(np.mean([1.0 / s for s in range(51 - w, 51)]))
  teacher = entries["teacher_desktop"]["offline"]["by_platform"]["desktop"]["step_success"]
  by_step = [a for _, a in d["offline_desktop_by_step"]]
  assert [s for s, _ in d["offline_desktop_by_step"]] == [0, 25, 50]
  assert by_step == [entries["base"]["offline"]["by_platform"]["desktop"]["step_success"]] + [
      e["offline"]["by_platform"]["desktop"]["step_success"] for e in steps]
  reach = next((s for s, a in d["offline_desktop_by_step"] if a >= 0.9 * teacher), None)
  assert res["targets"]["(a) first checkpoint at >= 90% of the teacher"] == reach
  ratio = d["kl_first_window"] / d["kl_last_window"]
  assert res["claims"]["(a) KL down >= 5x"] == ("yes" if ratio >= 5 else "no")
  mob = entries["mopd"]["offline"]["by_platform"]["mobile"]["step_success"]
  t_mob = entries["teacher_mobile"]["offline"]["by_platform"]["mobile"]["step_success"]
  assert res["targets"]["(b) mopd mobile offline accuracy / teacher's"] == pytest.approx(mob / t_mob)
  off = entries["mopd_distill"]["offline"]["by_platform"]["mobile"]["step_success"]
  assert res["targets"]["(b) mopd_distill mobile offline accuracy / teacher's"] == pytest.approx(off / t_mob)
  assert "| sweep_k3_0.001 |" in open(os.path.join(root, "report.md")).read()
  for png in res["figures"].values():
    assert os.path.getsize(os.path.join(root, png)) > 1000
  # one arm alone (a partial rerun): fractions of each teacher, KL windows, offline by checkpoint
  from guilibra_jax.eval.study_report import distill_arm
  arm = "mopd_distill_2x"
  write_report(os.path.join(root, f"eval_{arm}_steps"), steps, connect=False)
  a = distill_arm(root, S, arm, window=20)
  assert a["offline_fraction_of_teacher"]["mobile"] == pytest.approx(
    entries[arm]["offline"]["by_platform"]["mobile"]["step_success"] / t_mob)
  assert a["target_90pct_of_each_teacher"]["mobile"] == (a["offline_fraction_of_teacher"]["mobile"] >= 0.9)
  assert list(a["kl_by_20_steps"]) == ["1-20", "21-40", "41-50"] and a["kl_by_20_steps"]["41-50"] == 0.5
  assert [r["step"] for r in a["offline_by_step"]] == [0, 25, 50]
  assert a["offline_by_step"][1]["desktop"] == steps[0]["offline"]["by_platform"]["desktop"]["step_success"]


def test_teacher_fraction_pairs_the_same_held_out_steps(tmp_path):
  from guilibra_jax.eval.study_report import teacher_fraction

  def write(name, passed, platform="mobile", extra=()):
    d = tmp_path / name
    d.mkdir()
    steps = [{"trajectory_id": f"{platform}-{i // 3}", "step": i % 3, "platform": platform, "step_success": bool(v)}
             for i, v in enumerate(passed)]
    steps += [{"trajectory_id": "desktop-0", "step": 0, "platform": "desktop", "step_success": True}, *extra]
    (d / "offline_checkpoint.json").write_text(json.dumps({"steps": steps}))
    return str(d)

  teacher = write("t", [1, 1, 1, 1, 0, 0, 1, 1, 0, 1])   # 7 of 10
  student = write("s", [1, 0, 1, 1, 0, 1, 1, 0, 0, 1])   # 6 of 10
  r = teacher_fraction(student, teacher, "mobile")
  assert r["steps"] == 10 and r["student"] == 0.6 and r["teacher"] == 0.7
  assert r["fraction"] == pytest.approx(6 / 7) and r["ci95"][0] < 6 / 7 < r["ci95"][1]
  other = write("o", [1] * 9, extra=())
  with pytest.raises(ValueError, match="different mobile steps"):
    teacher_fraction(other, teacher, "mobile")
  old = tmp_path / "old"
  old.mkdir()
  (old / "offline_checkpoint.json").write_text(json.dumps({"overall": {}}))
  with pytest.raises(ValueError, match="lists no steps"):
    teacher_fraction(str(old), teacher, "mobile")


def test_a_study_refuses_another_studys_workdir(tmp_path):
  from guilibra_jax.errors import UserError
  from guilibra_jax.eval.study_workdir import claim_workdir
  claim_workdir(str(tmp_path), "mopd", ["base"])
  with pytest.raises(UserError, match=r"holds the 'mopd' study"):
    claim_workdir(str(tmp_path), "distill", ["base"])
  claim_workdir(str(tmp_path), "mopd", ["base"])           # the same study resumes
  old = tmp_path / "old"                                    # a folder from before the marker
  (old / "mixed_sft").mkdir(parents=True)
  (old / "mixed_sft" / "study_stage.json").write_text("{}")
  with pytest.raises(UserError, match=r"stages of another study \(mixed_sft\)"):
    claim_workdir(str(old), "distill", ["base", "teacher_desktop"])
