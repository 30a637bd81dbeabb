"""Shared plumbing of Myriad's side-by-side benchmarks (BENCHMARKS.md).

Each benchmark runs Myriad and its peer alternately (A B A B ...) in one
invocation, takes the median of each, and prints one JSON line last.
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("MYRIAD_BUILD", os.path.join(ROOT, "build"))
PY = "/usr/bin/python3"  # Debian's python, which has torch


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def has_avx512():
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
        return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    except (OSError, StopIteration):
        return False


def myriad_env():
    """Myriad picks its BLAS core type itself: clear any inherited choice."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def peer_env():
    """PyTorch's fastest ordinary setting here (BENCHMARKS.md): the same
    OpenBLAS core type Myriad picks, set before torch loads."""
    env = dict(os.environ)
    env.pop("OPENBLAS_L2_SIZE", None)
    env["OPENBLAS_CORETYPE"] = "SkylakeX" if has_avx512() else "Haswell"
    return env


def run_json(cmd, env, timeout=1800):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"benchmark command failed ({p.returncode}): {' '.join(cmd)}")
    line = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
    out = json.loads(line)
    out["_wall_s"] = time.time() - t0
    return out


def alternate(rounds, runners, log=True):
    """Runs the named runners in turn, round after round (A B C A B C ...);
    returns {name: [result per round]}."""
    out = {name: [] for name in runners}
    for r in range(rounds):
        for name, run in runners.items():
            out[name].append(run())
        if log:
            sys.stderr.write(f"  round {r + 1}/{rounds}: " + ", ".join(
                f"{name} {out[name][-1]['tokens_per_s']:.1f} tok/s" for name in runners) + "\n")
    return out


def median(xs):
    return statistics.median(xs)


def emit(record, json_out=None):
    record.setdefault("date", time.strftime("%Y-%m-%d"))
    record.setdefault("cpu", cpu_model())
    line = json.dumps(record, sort_keys=False)
    if json_out:
        os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
        with open(json_out, "w") as f:
            f.write(line + "\n")
    print(line)
