#!/usr/bin/env python3
"""Summarises the post-training experiments (scripts/rl_experiments.sh OUT):
held-out scores before and after each run, from their metrics.jsonl, as a
Markdown table on stdout and JSON in OUT/summary.json; OUT/reward.dat holds
reward and pass@1 per iteration for the plot (scripts/rl_plot.gp)."""
import json
import os
import sys

out = sys.argv[1]


def records(run):
    path = os.path.join(out, run, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


def evals(recs):
    return [r for r in recs if "eval" in r]


runs = [r for r in sorted(os.listdir(out)) if os.path.exists(os.path.join(out, r, "metrics.jsonl"))
        and r != "pre"]
summary = {}
print("| run | domain | pass@1 before | pass@1 after | pass@k after | greedy after | iterations | rollout share | wall s |")
print("|---|---|---|---|---|---|---|---|---|")
for run in runs:
    recs = records(run)
    ev = evals(recs)
    if not ev:
        continue
    it = [r for r in recs if r.get("iteration", 0) > 0]
    roll = sum(r["rollout_s"] for r in it)
    wall = sum(r["iteration_s"] for r in it)
    first, last = ev[0]["eval"], ev[-1]["eval"]
    summary[run] = {"before": first, "after": last, "iterations": len(it), "rollout_s": roll, "wall_s": wall,
                    "rollout_tokens_per_s": (sum(r["rollout_tokens"] for r in it) / roll) if roll else 0}
    for d in sorted(last.get("domains", {})):
        b, a = first["domains"].get(d, {}), last["domains"][d]
        print(f"| {run} | {d} | {b.get('pass1', 0):.3f} | {a['pass1']:.3f} | {a['passk']:.3f} | {a['greedy']:.3f} "
              f"| {len(it)} | {roll / wall if wall else 0:.0%} | {wall:.0f} |")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)

# Reward and held-out pass@1 per iteration of the RL and SFT runs on arithmetic.
with open(os.path.join(out, "reward.dat"), "w") as f:
    for run in ("rl-arith", "sft-arith"):
        recs = records(run)
        f.write(f"# {run}: iteration reward_mean correct\n")
        for r in recs:
            if r.get("iteration", 0) > 0:
                f.write(f"{r['iteration']} {r['reward_mean']} {r['correct']}\n")
        f.write("\n\n")
        f.write(f"# {run}: iteration heldout_pass1\n")
        for r in evals(recs):
            f.write(f"{r['iteration']} {r['eval']['all']['pass1']}\n")
        f.write("\n\n")

# Held-out pass@1 per domain over iterations of the students (1200
# iterations, cosine decay), and the teachers' final scores, for
# scripts/rl_mopd_plot.gp: blocks arithmetic then python, one per student.
students = [("mopd-cos", "MOPD, two domain teachers"), ("sft-teacher-cos", "SFT on the teachers' samples"),
            ("mopd-mixed-cos", "MOPD, one mixed teacher")]
teacher = {"arithmetic": "rl-arith", "python": "rl-python"}
if all(records(s) for s, _ in students):
    with open(os.path.join(out, "mopd.dat"), "w") as f:
        for d in ("arithmetic", "python"):
            ev = evals(records(teacher[d]))
            f.write(f"# teacher {teacher[d]} final {d} pass@1: {ev[-1]['eval']['domains'][d]['pass1'] if ev else 0}\n")
            for s, title in students:
                f.write(f"# {s}: {title}: iteration {d}_pass1\n")
                for r in evals(records(s)):
                    f.write(f"{r['iteration']} {r['eval']['domains'][d]['pass1']}\n")
                f.write("\n\n")
