"""The studies' reports (``launch.study``): tables from the eval stages' ``report.json``
and the training runs' ``metrics.jsonl``, written as ``results.json``, ``report.md`` and
PNG figures into the study's workdir.

    mopd_report(root, study)       UI-MOPD's table: online success per platform with 95%
                                   Wilson intervals, offline step accuracy, the paper's rows,
                                   every ordering of the paper's table (paired by seed)
    guilibra_report(root, study)   ASFT ablations; GRPO arms: curves, every checkpoint's
                                   offline and online scores, Spearman offline vs online
    distill_report(root, study)    on-policy distillation: KL over steps, offline accuracy
                                   at checkpoints against the teachers, MOPD per platform
    grpo_report(root, study)       GRPO from an SFT start, offline vs on live episodes: online
                                   success per platform with intervals, reward / KL / groups
                                   with equal rewards over training, the part-4 targets, the
                                   confirmation on fresh seeds (``confirm``: paired by seed)

``study`` is the recipe module (``configs/study_<name>.py``): its model / run names and
the paper's numbers.
"""

from __future__ import annotations

import json
import os
from typing import Any

from guilibra_jax.eval import figures as F
from guilibra_jax.eval.report import plot_points
from guilibra_jax.eval.stats import paired_bootstrap, paired_ratio_bootstrap, spearman, wilson
from guilibra_jax.train.curves import read_metrics, series

RESULTS, REPORT = "results.json", "report.md"


def _eval_entries(root: str, name: str) -> list[dict]:
    with open(os.path.join(root, f"eval_{name}", "report.json")) as f:
        return json.load(f)["checkpoints"]


def _online(root: str, stage: str, entry: str = "checkpoint") -> dict[tuple[str, int], float]:
    """An eval stage entry's online episodes (``online_<entry>.json``): {(platform, seed): 0/1}."""
    with open(os.path.join(root, stage, f"online_{entry}.json")) as f:
        return {(e["platform"], e["seed"]): float(bool(e["success"])) for e in json.load(f)["episodes"]}


def _sweep(root: str, name: str) -> list[tuple[int, dict]]:
    """A checkpoint sweep's entries (``checkpoint@<step>``) as (step, entry), in step order."""
    return sorted(((int(e["name"].split("@")[1]), e) for e in _eval_entries(root, name)), key=lambda x: x[0])


def scores(entry: dict, platforms) -> dict[str, Any]:
    """One evaluated model: per platform the online episodes, successes, rate and 95%
    interval, and the offline step / grounding / action-type accuracy; overall too."""
    on, off = entry["online"]["by_platform"], entry["offline"]["by_platform"]
    out: dict[str, Any] = {}
    for p in platforms:
        n = int(on.get(p, {}).get("episodes") or 0)
        rate = on.get(p, {}).get("success_rate")
        k = int(round((rate or 0.0) * n))
        o = off.get(p, {})
        out[p] = {"episodes": n, "successes": k, "success_rate": rate, "ci95": list(wilson(k, n)),
                  "offline_step_success": o.get("step_success"),
                  "offline_grounding_accuracy": o.get("grounding_accuracy"),
                  "offline_action_type_accuracy": o.get("action_type_accuracy")}
    ov, oo = entry["online"]["overall"], entry["offline"]["overall"]
    n = int(ov.get("episodes") or 0)
    k = int(round((ov.get("success_rate") or 0.0) * n))
    out["overall"] = {"episodes": n, "successes": k, "success_rate": ov.get("success_rate"),
                      "ci95": list(wilson(k, n)), "offline_step_success": oo.get("step_success"),
                      "offline_grounding_accuracy": oo.get("grounding_accuracy"),
                      "offline_action_type_accuracy": oo.get("action_type_accuracy"),
                      "offline_steps": oo.get("n")}
    return out


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _cell(s: dict) -> str:
    lo, hi = s["ci95"]
    return f"{_fmt(s['success_rate'])} [{lo:.2f}, {hi:.2f}] ({s['successes']}/{s['episodes']})"


def _points(name: str, sc: dict, platforms, series_name: str | None = None) -> list[dict]:
    return [{"name": name, "series": series_name, "platform": p, "offline_step_success": sc[p]["offline_step_success"],
             "online_success": sc[p]["success_rate"]} for p in platforms
            if sc[p]["offline_step_success"] is not None and sc[p]["success_rate"] is not None]


def _write(root: str, results: dict, lines: list[str]) -> dict:
    with open(os.path.join(root, RESULTS), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(root, REPORT), "w") as f:
        f.write("\n".join(lines) + "\n")
    return results


def _curve(root: str, run: str, key: str) -> list[tuple[float, float]]:
    path = os.path.join(root, run, "metrics.jsonl")
    return series(read_metrics(path), key) if os.path.exists(path) else []


def _beats(a: dict, b: dict, strict: bool = False) -> str:
    """'yes' / 'no' for a >= b (a > b when ``strict``), noting when the 95% intervals overlap."""
    ra, rb = a["success_rate"] or 0, b["success_rate"] or 0
    ge = ra > rb if strict else ra >= rb
    overlap = a["ci95"][0] <= b["ci95"][1] and b["ci95"][0] <= a["ci95"][1]
    return ("yes" if ge else "no") + (" (intervals overlap)" if overlap else "")


# ----------------------------------------------------------------------------- UI-MOPD

def _paper_model(name: str, platform: str, study) -> str:
    """Our model in the paper's row ``name`` ("teachers": that platform's ``study.TEACHERS``
    entry, else ``teacher_<platform>``)."""
    if name != "teachers":
        return name
    teachers = getattr(study, "TEACHERS", ())
    return next((t for t in teachers if t.startswith(f"teacher_{platform}")), f"teacher_{platform}")


def orderings(root: str, study, arm: str = "mopd") -> list[dict]:
    """Every ordering of the paper's table (``study.PAPER``, row "mopd" played by ``arm``),
    per platform, against ours: the online rates of the two models on the same held-out
    seeds, the paired bootstrap 95% interval of the difference (the paper's higher row minus
    its lower), and a verdict: "holds" (interval above 0), "same direction" (ours higher, the
    interval takes in 0), "tie", "reversed" (ours lower, the interval takes in 0) or
    "reversed, significant" (interval below 0)."""
    rows = list(study.PAPER)
    out = []
    for k, p in enumerate(study.PLATFORMS):
        for a in rows:
            for b in rows:
                if study.PAPER[a][k] <= study.PAPER[b][k]:
                    continue
                ma, mb = (arm if r == "mopd" else _paper_model(r, p, study) for r in (a, b))
                ea, eb = ({seed: v for (pl, seed), v in _online(root, f"eval_{m}").items() if pl == p}
                          for m in (ma, mb))
                seeds = sorted(set(ea) & set(eb))
                if not seeds:
                    raise ValueError(f"orderings: eval_{ma} and eval_{mb} played no common {p} seed")
                d, lo, hi = paired_bootstrap([eb[x] for x in seeds], [ea[x] for x in seeds])
                verdict = ("holds" if lo > 0 else "reversed, significant" if hi < 0 else
                           "same direction" if d > 0 else "reversed" if d < 0 else "tie")
                out.append({"platform": p, "higher": a, "lower": b, "models": [ma, mb],
                            "paper": [study.PAPER[a][k], study.PAPER[b][k]], "episodes": len(seeds),
                            "ours": [sum(ea[x] for x in seeds) / len(seeds), sum(eb[x] for x in seeds) / len(seeds)],
                            "difference": d, "ci95": [lo, hi], "verdict": verdict})
    return out


def mopd_report(root: str, study) -> dict:
    """UI-MOPD's table: every model's online success per platform (95% Wilson intervals)
    and offline step accuracy, the paper's numbers beside them, and every ordering of the
    paper's table tested on ours (:func:`orderings`, for each MOPD arm)."""
    P = study.PLATFORMS
    arms = getattr(study, "MOPD_ARMS", ("mopd",))
    rows = {m: scores(_eval_entries(root, m)[0], P) for m in study.MODELS}
    order = {arm: orderings(root, study, arm) for arm in arms}
    claims = {f"{arm}: {o['higher']} > {o['lower']} on {o['platform']}": o["verdict"]
              for arm in arms for o in order[arm] if arm == "mopd" or "mopd" in (o["higher"], o["lower"])}
    results = {"study": "mopd", "models": rows, "paper": {k: dict(zip(P, v)) for k, v in study.PAPER.items()},
               "orderings": order, "claims": claims}
    runs = getattr(study, "MOPD_RUNS", arms)
    figs = {
        "online": F.bars(os.path.join(root, "online_by_platform.png"), "online task success (95% Wilson intervals)",
                         list(study.MODELS), list(P), [[rows[m][p]["success_rate"] for p in P] for m in study.MODELS],
                         [[tuple(rows[m][p]["ci95"]) for p in P] for m in study.MODELS]),
        "mopd_reward": F.lines(os.path.join(root, "mopd_reward.png"), "MOPD student: rollout reward",
                               [(f"{run} {p}", _curve(root, run, f"{p}/reward_mean")) for run in runs for p in P]),
        "mopd_kl": F.lines(os.path.join(root, "mopd_kl.png"), "MOPD student: KL to its platform's teacher",
                           [(run, _curve(root, run, "kl")) for run in runs]),
    }
    pts = [pt for m in study.MODELS for pt in _points(m, rows[m], P)]
    plot_points(pts, os.path.join(root, "offline_vs_online.png"))
    figs["offline_vs_online"] = os.path.join(root, "offline_vs_online.png")
    results["figures"] = {k: os.path.basename(v) for k, v in figs.items()}
    lines = ["# UI-MOPD study on the synthetic world", "",
             "Online task success on held-out task seeds (rate [95% Wilson interval] (successes/episodes)) and "
             "offline greedy step accuracy on held-out steps. Paper: Qwen3-VL-8B student, 32B teachers, "
             "OSWorld (desktop) / MobileWorld (mobile) success in %.", "",
             "| model | " + " | ".join(f"{p} online" for p in P) + " | " + " | ".join(f"{p} offline" for p in P)
             + " | offline (all) | paper " + " / ".join(P) + " |",
             "|" + "---|" * (3 + 2 * len(P))]
    paper_of = {m: r for r in study.PAPER for m in {_paper_model(r, p, study) for p in P}}
    for m in study.MODELS:
        r = rows[m]
        paper = study.PAPER.get(m) or study.PAPER.get(paper_of.get(m, ""))
        lines.append(f"| {m} | " + " | ".join(_cell(r[p]) for p in P) + " | "
                     + " | ".join(_fmt(r[p]["offline_step_success"]) for p in P)
                     + f" | {_fmt(r['overall']['offline_step_success'])} | "
                     + (" / ".join(f"{v:.1f}" for v in paper) if paper else "-") + " |")
    for arm in arms:
        o = order[arm]
        held = sum(x["verdict"] == "holds" for x in o)
        same = sum(x["verdict"] in ("holds", "same direction") for x in o)
        lines += ["", f"## The paper's orderings, with {arm} as UI-MOPD", "",
                  f"{len(o)} orderings (every pair of the paper's rows, per platform): {held} hold (paired 95% "
                  f"interval above 0), {same} have ours in the same direction. Same held-out seeds for both "
                  "models; difference = the paper's higher row minus its lower.", "",
                  "| platform | paper: higher > lower | paper | ours | difference [paired 95%] | verdict |",
                  "|---|---|---|---|---|---|"]
        for x in o:
            lo, hi = x["ci95"]
            lines.append(f"| {x['platform']} | {x['models'][0]} > {x['models'][1]} | {x['paper'][0]:.1f} vs "
                         f"{x['paper'][1]:.1f} | {x['ours'][0]:.2f} vs {x['ours'][1]:.2f} | {x['difference']:+.3f} "
                         f"[{lo:+.3f}, {hi:+.3f}] | {x['verdict']} |")
    lines += ["", "Figures: " + ", ".join(f"![{k}]({v})" for k, v in results["figures"].items())]
    return _write(root, results, lines)


# ----------------------------------------------------------------------------- GUI-Libra

def _outcomes(root: str, stage: str, entry: str = "checkpoint") -> tuple[dict, dict]:
    """One evaluated entry's held-out outcomes: {(trajectory, step): 0/1} offline (the
    ``steps`` of offline_<entry>.json) and {(platform, seed): 0/1} online."""
    with open(os.path.join(root, stage, f"offline_{entry}.json")) as f:
        off = {(r["trajectory_id"], r["step"]): float(r["step_success"]) for r in json.load(f)["steps"]}
    return off, _online(root, stage, entry)


def predictability(root: str, study, n_boot: int = 2000) -> dict:
    """The paper's claim that beta > 0 keeps offline scores predictive of online success:
    each GRPO arm's checkpoints (its start first) as 0/1 matrices over the held-out steps and
    episodes every one of them played, and :func:`stats.spearman_difference` of the arms
    with ``study.BETAS`` > 0 against those with 0."""
    import numpy as np
    from guilibra_jax.eval.stats import spearman_difference
    runs = {}
    for arm in study.GRPO:
        entries = [("checkpoint", f"eval_{study.START}")] + [
            (e["name"], f"eval_{arm}") for _, e in _sweep(root, arm)]
        runs[arm] = [_outcomes(root, stage, name) for name, stage in entries]
    k_off = sorted(set.intersection(*(set(off) for r in runs.values() for off, _ in r)))
    k_on = sorted(set.intersection(*(set(on) for r in runs.values() for _, on in r)))
    mats = {a: (np.array([[off[k] for k in k_off] for off, _ in r]), np.array([[on[k] for k in k_on] for _, on in r]))
            for a, r in runs.items()}
    pos = [a for a in study.GRPO if study.BETAS[a] > 0]
    neg = [a for a in study.GRPO if study.BETAS[a] == 0]
    out = spearman_difference([mats[a] for a in pos], [mats[a] for a in neg], n_boot=n_boot)
    out["rho"] = dict(zip(pos + neg, out["rho"]))
    return {**out, "beta_positive": pos, "beta_zero": neg, "steps": len(k_off), "episodes": len(k_on)}


def guilibra_report(root: str, study) -> dict:
    """ASFT ablations (offline and online, held out); the GRPO arms from ``study.START``:
    every checkpoint's offline and online scores, the final checkpoint against the start
    (online paired by seed, offline change), Spearman offline vs online per arm, and the
    predictability claim (:func:`predictability`)."""
    P = ("desktop", "mobile")
    start_name = getattr(study, "START", study.SFT[0])
    sft = {a: scores(_eval_entries(root, a)[0], P) for a in study.SFT}
    start = sft[start_name]
    arms: dict[str, Any] = {}
    claims: dict[str, str] = {}
    pts = []
    _, start_on = _outcomes(root, f"eval_{start_name}")
    for arm in study.GRPO:
        entries = [e for _, e in _sweep(root, arm)]
        ckpts = [(0, start)] + [(st, scores(e, P)) for st, e in _sweep(root, arm)]
        off = [s["overall"]["offline_step_success"] for _, s in ckpts]
        on = [s["overall"]["success_rate"] for _, s in ckpts]
        kl = _curve(root, arm, "kl")
        reward = _curve(root, arm, "reward_mean")
        _, last_on = _outcomes(root, f"eval_{arm}", entries[-1]["name"])
        seeds = sorted(set(start_on) & set(last_on))
        d, lo, hi = paired_bootstrap([start_on[k] for k in seeds], [last_on[k] for k in seeds])
        arms[arm] = {"checkpoints": [{"step": st, **s} for st, s in ckpts],
                     "spearman_offline_vs_online": spearman(off, on),
                     "final_vs_start_online": {"difference": d, "ci95": [lo, hi], "episodes": len(seeds)},
                     "final_vs_start_offline": (off[-1] - off[0]) if None not in (off[0], off[-1]) else None,
                     "final_kl": kl[-1][1] if kl else None,
                     "reward_first_last": [reward[0][1], reward[-1][1]] if reward else None}
        claims[f"{arm}: final online > {start_name} (paired 95% interval above 0)"] = "yes" if lo > 0 else "no"
        for st, s in ckpts:
            pts += _points(f"{arm}@{st}", s, P, arm)
    pred = predictability(root, study) if getattr(study, "BETAS", None) else None
    if pred:
        lo = pred["ci95"][0]
        claims["beta > 0 keeps offline predictive of online (rho difference, 95% interval above 0)"] = (
            "yes" if lo is not None and lo > 0 else "no")
    results = {"study": "guilibra", "asft": sft, "start": start_name, "grpo": arms, "predictability": pred,
               "claims": claims}
    figs = {
        "asft_offline": F.bars(os.path.join(root, "asft_offline.png"), "ASFT ablations: held-out offline accuracy",
                               list(study.SFT), ["step", "grounding", "action type"],
                               [[sft[a]["overall"][k] for k in ("offline_step_success", "offline_grounding_accuracy",
                                                                "offline_action_type_accuracy")] for a in study.SFT],
                               [[None] * 3 for _ in study.SFT], y_label="accuracy"),
        "asft_online": F.bars(os.path.join(root, "asft_online.png"), "ASFT ablations: online success (95% Wilson)",
                              list(study.SFT), list(P), [[sft[a][p]["success_rate"] for p in P] for a in study.SFT],
                              [[tuple(sft[a][p]["ci95"]) for p in P] for a in study.SFT]),
        "grpo_reward": F.lines(os.path.join(root, "grpo_reward.png"), "GRPO arms: rollout reward",
                               [(a, _curve(root, a, "reward_mean")) for a in study.GRPO]),
        "grpo_kl": F.lines(os.path.join(root, "grpo_kl.png"), "GRPO arms: KL to the SFT start",
                           [(a, _curve(root, a, "kl")) for a in study.GRPO]),
        "grpo_online": F.lines(os.path.join(root, "grpo_online.png"), "GRPO arms: held-out online success by step",
                               [(a, [(c["step"], c["overall"]["success_rate"]) for c in r["checkpoints"]])
                                for a, r in arms.items()]),
    }
    plot_points(pts, os.path.join(root, "offline_vs_online.png"), title="checkpoints: offline vs online")
    figs["offline_vs_online"] = os.path.join(root, "offline_vs_online.png")
    results["figures"] = {k: os.path.basename(v) for k, v in figs.items()}
    lines = ["# GUI-Libra study on the synthetic world", "", "## ASFT (held-out)", "",
             "| run | offline step | grounding | action type | " + " | ".join(f"{p} online" for p in P) + " |",
             "|" + "---|" * (4 + len(P))]
    for a in study.SFT:
        o = sft[a]["overall"]
        lines.append(f"| {a} | {_fmt(o['offline_step_success'])} | {_fmt(o['offline_grounding_accuracy'])} | "
                     f"{_fmt(o['offline_action_type_accuracy'])} | " + " | ".join(_cell(sft[a][p]) for p in P) + " |")
    lines += ["", f"## GRPO from {start_name}: beta x SNGS", "",
              "| arm | checkpoints (step: offline / online) | final - start online [paired 95%] | "
              "Spearman offline vs online | final KL | reward first -> last |", "|---|---|---|---|---|---|"]
    for arm, r in arms.items():
        ck = ", ".join(f"{c['step']}: {_fmt(c['overall']['offline_step_success'])} / "
                       f"{_fmt(c['overall']['success_rate'])}" for c in r["checkpoints"])
        rf, fv = r["reward_first_last"], r["final_vs_start_online"]
        lines.append(f"| {arm} | {ck} | {fv['difference']:+.3f} [{fv['ci95'][0]:+.3f}, {fv['ci95'][1]:+.3f}] | "
                     f"{_fmt(r['spearman_offline_vs_online'])} | {_fmt(r['final_kl'], 4)} | "
                     + (f"{rf[0]:.2f} -> {rf[1]:.2f}" if rf else "-") + " |")
    if pred:
        lo, hi = pred["ci95"]
        lines += ["", "## Predictability (the paper's claim for beta > 0)", "",
                  f"Spearman's rho between each arm's checkpoints' offline and online scores: "
                  + ", ".join(f"{a} {_fmt(v)}" for a, v in pred["rho"].items())
                  + f". Mean over beta > 0 minus mean over beta = 0: {_fmt(pred['difference'])} "
                  f"[{_fmt(lo)}, {_fmt(hi)}] (bootstrap over {pred['steps']} held-out steps and "
                  f"{pred['episodes']} episodes, {pred['draws']} draws, {pred['undefined_draws']} undefined)."]
    lines += ["", "## Claims", ""] + [f"- {k}: {v}" for k, v in claims.items()]
    lines += ["", "Figures: " + ", ".join(f"![{k}]({v})" for k, v in results["figures"].items())]
    return _write(root, results, lines)


# ----------------------------------------------------------------------------- distillation

def _window(curve: list[tuple[float, float]], n: int, last: bool) -> float | None:
    vals = [v for _, v in (curve[-n:] if last else curve[:n])]
    return sum(vals) / len(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def distill_arm(root: str, study, arm: str, window: int = 100) -> dict:
    """One MOPD arm of the distillation study against the base and the teachers (their
    eval stages): offline and online per platform, offline accuracy as a fraction of each
    platform's teacher and the 90% target, the KL to the teachers in ``window``-step
    windows, and offline accuracy at every checkpoint when eval_<arm>_steps ran."""
    P = study.PLATFORMS
    names = ("base", *(f"teacher_{p}" for p in P), arm)
    rows = {m: scores(_eval_entries(root, m)[0], P) for m in names}
    teacher = {p: rows[f"teacher_{p}"][p]["offline_step_success"] for p in P}
    frac = {p: _ratio(rows[arm][p]["offline_step_success"], teacher[p]) for p in P}
    kl = _curve(root, arm, "kl")
    windows = {f"{int(kl[i][0])}-{int(kl[min(i + window, len(kl)) - 1][0])}":
               sum(v for _, v in kl[i:i + window]) / len(kl[i:i + window]) for i in range(0, len(kl), window)}
    out = {"models": rows, "offline_fraction_of_teacher": frac,
           "target_90pct_of_each_teacher": {p: (frac[p] or 0) >= 0.9 for p in P}, f"kl_by_{window}_steps": windows}
    if os.path.exists(os.path.join(root, f"eval_{arm}_steps", "report.json")):
        by_step = [(0, {p: rows["base"][p]["offline_step_success"] for p in P})]
        by_step += [(st, {p: scores(e, P)[p]["offline_step_success"] for p in P})
                    for st, e in _sweep(root, f"{arm}_steps")]
        out["offline_by_step"] = [{"step": st, **acc, **{f"{p}_fraction_of_teacher": _ratio(acc[p], teacher[p])
                                                          for p in P}} for st, acc in by_step]
    return out


def teacher_fraction(student_dir: str, teacher_dir: str, platform: str) -> dict:
    """A student's held-out offline step accuracy on ``platform`` as a fraction of its
    teacher's, with a paired bootstrap interval over the steps: two launch.eval workdirs
    that scored the same held-out steps (their offline_checkpoint.json list each step)."""
    def outcomes(d):
        with open(os.path.join(d, "offline_checkpoint.json")) as f:
            steps = json.load(f).get("steps")
        if steps is None:
            raise ValueError(f"{d}/offline_checkpoint.json lists no steps (an eval from before they were listed)")
        return {(r["trajectory_id"], r["step"]): float(r["step_success"]) for r in steps if r["platform"] == platform}
    s, t = outcomes(student_dir), outcomes(teacher_dir)
    if s.keys() != t.keys():
        raise ValueError(f"{student_dir} and {teacher_dir} scored different {platform} steps")
    keys = sorted(s)
    ratio, lo, hi = paired_ratio_bootstrap([s[k] for k in keys], [t[k] for k in keys])
    return {"steps": len(keys), "student": sum(s.values()) / len(keys), "teacher": sum(t.values()) / len(keys),
            "fraction": ratio, "ci95": [lo, hi]}


def distill_report(root: str, study) -> dict:
    """(a) the desktop distillation: per-token KL to the teacher over steps (first vs last
    window) and held-out offline accuracy at every checkpoint against the teacher's;
    (b) MOPD with both teachers: offline and online per platform against each teacher;
    the sweep that chose the estimator and lr."""
    P = study.PLATFORMS
    rows = {m: scores(_eval_entries(root, m)[0], P) for m in study.MODELS}
    with open(os.path.join(root, study.CHOSEN)) as f:
        choice = json.load(f)
    w = study.SWEEP_WINDOW
    kl = _curve(root, "distill_desktop", "kl")
    kl_first, kl_last = _window(kl, w, last=False), _window(kl, w, last=True)
    teacher_off = {p: rows[f"teacher_{p}"][p]["offline_step_success"] for p in P}
    steps = [(0, rows["base"]["desktop"]["offline_step_success"])]
    steps += [(st, scores(e, P)["desktop"]["offline_step_success"]) for st, e in _sweep(root, "distill_desktop_steps")]
    reach = next((st for st, acc in steps if acc is not None and teacher_off["desktop"]
                  and acc >= 0.9 * teacher_off["desktop"]), None)
    final_off = rows["distill_desktop"]["desktop"]["offline_step_success"]
    targets = {
        "(a) KL down at least 5x (first vs last window)": _ratio(kl_first, kl_last),
        "(a) desktop offline accuracy / teacher's (final)": _ratio(final_off, teacher_off["desktop"]),
        "(a) first checkpoint at >= 90% of the teacher": reach,
    }
    arms = getattr(study, "MOPD_ARMS", ("mopd",))
    for arm in arms:
        for p in P:
            targets[f"(b) {arm} {p} offline accuracy / teacher's"] = _ratio(rows[arm][p]["offline_step_success"],
                                                                           teacher_off[p])
    claims = {"(a) KL down >= 5x": "yes" if (targets["(a) KL down at least 5x (first vs last window)"] or 0) >= 5
              else "no",
              "(a) >= 90% of the teacher's desktop offline accuracy": "yes" if reach is not None else "no"}
    for arm in arms:
        for p in P:
            r = targets[f"(b) {arm} {p} offline accuracy / teacher's"]
            claims[f"(b) {arm}: >= 90% of teacher_{p}'s offline accuracy on {p}"] = "yes" if (r or 0) >= 0.9 else "no"
            claims[f"(b) {arm} online > base on {p}"] = _beats(rows[arm][p], rows["base"][p], strict=True)
    results = {"study": "distill", "models": rows, "sweep": choice, "distill_desktop": {
        "kl_first_window": kl_first, "kl_last_window": kl_last, "steps": len(kl),
        "offline_desktop_by_step": steps, "teacher_offline": teacher_off}, "targets": targets, "claims": claims}
    figs = {
        "distill_kl": F.lines(os.path.join(root, "distill_kl.png"), "per-token KL to the teacher (training rollouts)",
                              [("distill_desktop", kl)] + [(arm, _curve(root, arm, "kl")) for arm in arms]
                              + [(a, _curve(root, a, "kl")) for a in choice["arms"]]),
        "distill_offline": F.lines(os.path.join(root, "distill_offline.png"),
                                   "distill_desktop: held-out desktop offline step accuracy",
                                   [("student", [(st, a) for st, a in steps if a is not None]),
                                    ("teacher", [(steps[0][0], teacher_off["desktop"]),
                                                 (steps[-1][0], teacher_off["desktop"])])]),
    }
    results["figures"] = {k: os.path.basename(v) for k, v in figs.items()}
    lines = ["# On-policy distillation study on the synthetic world", "",
             f"Sweep on training rollouts (mean per-token KL over the last {w} of "
             f"{study.SWEEP_STEPS} steps; lower is better), chosen: **{choice['arm']}**", "",
             "| arm | estimator | lr | KL first | KL last |", "|---|---|---|---|---|"]
    for a, r in choice["arms"].items():
        lines.append(f"| {a} | {r['estimator']} | {r['lr']:g} | {_fmt(r['kl_first'], 4)} | {_fmt(r['kl_last'], 4)} |")
    lines += ["", "## Models (held-out tasks)", "",
              "| model | " + " | ".join(f"{p} online" for p in P) + " | " + " | ".join(f"{p} offline" for p in P)
              + " |", "|" + "---|" * (1 + 2 * len(P))]
    for m in study.MODELS:
        lines.append(f"| {m} | " + " | ".join(_cell(rows[m][p]) for p in P) + " | "
                     + " | ".join(_fmt(rows[m][p]["offline_step_success"]) for p in P) + " |")
    lines += ["", "## (a) distill_desktop: offline desktop step accuracy by step", "",
              "| step | " + " | ".join(str(st) for st, _ in steps) + " |", "|" + "---|" * (1 + len(steps)),
              "| accuracy | " + " | ".join(_fmt(a) for _, a in steps) + " |", "",
              f"Teacher (desktop specialist): {_fmt(teacher_off['desktop'])}. KL first {w} steps "
              f"{_fmt(kl_first, 4)}, last {w} steps {_fmt(kl_last, 4)}.", "", "## Targets", ""]
    lines += [f"- {k}: {v if isinstance(v, (int, type(None))) else _fmt(v)}" for k, v in targets.items()]
    lines += [""] + [f"- {k}: {v}" for k, v in claims.items()]
    lines += ["", "Figures: " + ", ".join(f"![{k}]({v})" for k, v in results["figures"].items())]
    return _write(root, results, lines)


# ----------------------------------------------------------------------------- GRPO

def _disjoint_above(a: dict, b: dict) -> bool:
    """a's 95% interval lies wholly above b's."""
    return a["ci95"][0] > b["ci95"][1]


def _episode_windows(root: str, run: str, cap: int, n: int = 100) -> dict | None:
    """The first and last ``n`` training episodes an online run finished (``online_episodes.jsonl``):
    success, mean length and the share that ran to the step limit ``cap`` (looping)."""
    path = os.path.join(root, run, "online_episodes.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        eps = [json.loads(line) for line in f if line.strip()]
    if not eps:
        return None

    def window(w):
        return {"episodes": len(w), "success": sum(bool(e["success"]) for e in w) / len(w),
                "mean_steps": sum(e["steps"] for e in w) / len(w),
                "at_step_limit": sum(e["steps"] >= cap for e in w) / len(w)}

    return {"first": window(eps[:n]), "last": window(eps[-n:]), "episodes": len(eps), "step_limit": cap}


def confirm(root: str, study, stage: str = "confirm", seen_stages: tuple = ("eval",)) -> dict | None:
    """The confirmation of ``study.CONFIRM = (start, arm)`` on fresh held-out seeds: the
    episodes of the <stage>_<model> stages whose (platform, seed) no <seen>_<model> stage
    (``seen_stages``) played, paired by seed; per platform and overall each model's rate
    with its 95% Wilson interval and the paired difference (arm - start) with a bootstrap
    interval. None until both <stage> stages have run."""
    names = getattr(study, "CONFIRM", ())
    if not names or not all(os.path.exists(os.path.join(root, f"{stage}_{m}", "online_checkpoint.json"))
                            for m in names):
        return None
    seen = {k for m in names for s in seen_stages for k in _online(root, f"{s}_{m}")}
    outcome = {m: _online(root, f"{stage}_{m}") for m in names}
    start, arm = names
    keys = sorted(set(outcome[start]) & set(outcome[arm]) - seen)
    if set(outcome[start]) - seen != set(outcome[arm]) - seen:
        raise ValueError(f"{stage}: {start} and {arm} played different fresh seeds")
    out: dict[str, Any] = {"start": start, "arm": arm, "seen": len(seen)}
    for p in tuple(study.PLATFORMS) + ("overall",):
        ks = [k for k in keys if p in ("overall", k[0])]
        if not ks:
            continue
        row = {}
        for m in names:
            v = [outcome[m][k] for k in ks]
            n, hits = len(v), int(sum(v))
            row[m] = {"episodes": n, "successes": hits, "success_rate": hits / n, "ci95": list(wilson(hits, n))}
        d, lo, hi = paired_bootstrap([outcome[start][k] for k in ks], [outcome[arm][k] for k in ks])
        row["difference"] = {"mean": d, "ci95": [lo, hi]}
        out[p] = row
    return out


def grpo_report(root: str, study) -> dict:
    """Every model's held-out online success per platform and overall (95% Wilson intervals)
    and offline step accuracy; per GRPO run: rollout reward, KL and the share of groups with
    all-equal rewards (first vs last window), training-episode success of the online runs;
    the targets (against each arm's start, ``study.STARTS``) for the arm ``choose`` picked on
    training episodes, for the one ``choose_long`` picked, and for every arm outside both."""
    P = study.PLATFORMS
    rows = {m: scores(_eval_entries(root, m)[0], P) for m in study.MODELS}
    with open(os.path.join(root, study.CHOSEN)) as f:
        choice = json.load(f)
    starts, online = study.STARTS, tuple(study.ONLINE) + tuple(study.ONLINE_LONG)
    long_path, choice_long = os.path.join(root, study.CHOSEN_LONG), None
    if os.path.exists(long_path):    # absent until choose_long has run
        with open(long_path) as f:
            choice_long = json.load(f)
    runs = {}
    for m in study.MODELS[1:]:
        run = {}
        for key in ("reward_mean", "kl", "equal_reward_groups", "failed_groups", "online/episode_success"):
            c = _curve(root, m, key)
            if c:
                run[key] = {"first": _window(c, 10, last=False), "last": _window(c, 10, last=True)}
        if m in online:
            run["training_episodes"] = _episode_windows(root, m, study.STEP_LIMIT)
        runs[m] = run
    claims = {}

    def targets(m, per_platform=False):
        """Online above the arm's start with disjoint intervals; offline down by at most 0.02."""
        start = starts.get(m, "sft")
        r, s0 = rows[m], rows[start]
        d = (s0["overall"]["offline_step_success"] or 0) - (r["overall"]["offline_step_success"] or 0)
        claims[f"{m} online > {start} overall, intervals disjoint"] = "yes" if _disjoint_above(
            r["overall"], s0["overall"]) else "no"
        if per_platform:
            for p in P:
                claims[f"{m} online > {start} on {p}"] = _beats(r[p], s0[p], strict=True)
        claims[f"{m} offline step accuracy down by at most 0.02 (down {d:+.3f})"] = "yes" if d <= 0.02 else "no"

    targets(choice["arm"], per_platform=True)
    if choice_long:                  # the second follow-up's own disclosed choice (from sft_long)
        targets(choice_long["arm"], per_platform=True)
    for m in study.MODELS[1:]:
        if m not in study.ONLINE and not (choice_long and m == choice_long["arm"]):
            targets(m)               # arms outside the choices (follow-ups, diagnostics): the same targets
    conf = confirm(root, study)
    large = confirm(root, study, "confirm_large", ("eval", "confirm"))
    for c, where in ((conf, "fresh held-out seeds"), (large, "the large confirmation's fresh seeds")):
        if c and "overall" in c:
            start, arm = c["start"], c["arm"]
            o = c["overall"]
            claims[f"{arm} online > {start} on {where}, intervals disjoint"] = (
                "yes" if _disjoint_above(o[arm], o[start]) else "no")
            for p in tuple(P) + ("overall",):
                if p in c and (p == "overall" or c is large):
                    claims[f"{arm} - {start} on {where}" + ("" if p == "overall" else f" ({p})")
                           + ", paired 95% interval above 0"] = "yes" if c[p]["difference"]["ci95"][0] > 0 else "no"
    results = {"study": "grpo", "models": rows, "runs": runs, "choice": choice, "choice_long": choice_long,
               "starts": {m: starts.get(m, "sft") for m in study.MODELS[1:]}, "confirm": conf, "confirm_large": large,
               "claims": claims}
    figs = {key.replace("/", "_"): F.lines(os.path.join(root, f"grpo_{key.replace('/', '_')}.png"), title,
                                           [(m, _curve(root, m, key)) for m in study.MODELS[1:]])
            for key, title in (("reward_mean", "GRPO: rollout reward"), ("kl", "GRPO: KL to the SFT reference"),
                               ("equal_reward_groups", "GRPO: share of groups with all-equal rewards"),
                               ("online/episode_success", "online runs: training-episode success (last 100)"))}
    results["figures"] = {k: os.path.basename(v) for k, v in figs.items()}
    lines = ["# GRPO from an SFT start on the synthetic world", "",
             f"Chosen online arm (training episodes only): **{choice['arm']}** "
             + ", ".join(f"{a}: {r['train_success']:.2f} over {r['window']}" for a, r in choice["arms"].items()), ""]
    if choice_long:
        lines += [f"Second follow-up, from sft_long, chosen the same way: **{choice_long['arm']}** "
                  + ", ".join(f"{a}: {r['train_success']:.2f} over {r['window']}"
                              for a, r in choice_long["arms"].items()), ""]
    lines += [
             "## Models (held-out task seeds)", "",
             "| model | overall online | " + " | ".join(f"{p} online" for p in P) + " | offline | "
             + " | ".join(f"{p} offline" for p in P) + " |", "|" + "---|" * (3 + 2 * len(P))]
    for m in study.MODELS:
        r = rows[m]
        lines.append(f"| {m} | {_cell(r['overall'])} | " + " | ".join(_cell(r[p]) for p in P) + " | "
                     + _fmt(r["overall"]["offline_step_success"], 3) + " | "
                     + " | ".join(_fmt(r[p]["offline_step_success"], 3) for p in P) + " |")
    lines += ["", "## Training (first vs last 10 steps)", "",
              "| run | reward | KL | groups with equal rewards | groups with no passing response | "
              "training-episode success |", "|---|---|---|---|---|---|"]
    for m, run in runs.items():
        def fl(k, d=3):
            v = run.get(k)
            return "-" if v is None else f"{_fmt(v['first'], d)} -> {_fmt(v['last'], d)}"
        lines.append(f"| {m} | {fl('reward_mean')} | {fl('kl', 4)} | {fl('equal_reward_groups')} | "
                     f"{fl('failed_groups')} | {fl('online/episode_success')} |")
    lines += ["", f"## Training episodes of the online runs (first vs last 100; step limit {study.STEP_LIMIT})", "",
              "| run | episodes | success | mean steps | share at the step limit |", "|---|---|---|---|---|"]
    for m in online:
        w = runs[m].get("training_episodes")
        if w:
            f, la = w["first"], w["last"]
            lines.append(f"| {m} | {w['episodes']} | {f['success']:.2f} -> {la['success']:.2f} | "
                         f"{f['mean_steps']:.1f} -> {la['mean_steps']:.1f} | "
                         f"{f['at_step_limit']:.2f} -> {la['at_step_limit']:.2f} |")
    for c, title in ((conf, "Confirmation on fresh held-out seeds"),
                     (large, "Large confirmation on fresh held-out seeds (sized for disjoint intervals)")):
        if not c:
            continue
        start, arm = c["start"], c["arm"]
        lines += ["", f"## {title} (fixed before it ran; {c['seen']} platform-seeds played by earlier "
                  "stages left out; paired by seed)", "",
                  f"| platform | {start} | {arm} | difference (paired bootstrap 95%) |", "|---|---|---|---|"]
        for p in tuple(study.PLATFORMS) + ("overall",):
            if p in c:
                r = c[p]
                lo, hi = r["difference"]["ci95"]
                lines.append(f"| {p} | {_cell(r[start])} | {_cell(r[arm])} | "
                             f"{r['difference']['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    lines += ["", "## Targets", ""] + [f"- {k}: {v}" for k, v in claims.items()]
    lines += ["", "Figures: " + ", ".join(f"![{k}]({v})" for k, v in results["figures"].items())]
    return _write(root, results, lines)


REPORTS = {"mopd": mopd_report, "guilibra": guilibra_report, "distill": distill_report, "grpo": grpo_report}
