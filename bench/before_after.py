#!/usr/bin/python3
"""bench/before_after: one Myriad benchmark binary from two builds, alternating.

For "no regression" checks of a change: the same bench_<name> program from
the build before the change and the build after it, run in turn (A B A B ...)
in one invocation, medians and the after/before ratio of the figure named
by --metric (default tokens_per_s). Extra arguments after -- go to the
benchmark program.

    bench/before_after.py --before ../base/build --after build --bench train_throughput \\
        --rounds 5 -- --config configs/demo-moe.toml --steps 5 --precision fp32
"""
import argparse
import os
import sys

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="build directory before the change")
    ap.add_argument("--after", required=True, help="build directory after the change")
    ap.add_argument("--bench", required=True, help="benchmark name: runs BUILD/bench_NAME")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--metric", default="tokens_per_s")
    ap.add_argument("--json-out")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the benchmark program's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    cmds = {name: [os.path.join(d, f"bench_{a.bench}")] + args for name, d in (("before", a.before), ("after", a.after))}
    for name, cmd in cmds.items():
        if not os.access(cmd[0], os.X_OK):
            raise SystemExit(f"before_after: {cmd[0]} is not an executable (hint: build bench_{a.bench} in {name}'s build)")
    sys.stderr.write(f"before_after {a.bench}: {a.rounds} rounds, before and after alternating\n")
    res = common.alternate(a.rounds, {name: (lambda c=cmd: common.run_json(c, common.myriad_env()))
                                      for name, cmd in cmds.items()})
    b = common.median([r[a.metric] for r in res["before"]])
    f = common.median([r[a.metric] for r in res["after"]])
    sys.stderr.write(f"  median {a.metric}: before {b:.2f}, after {f:.2f}, after/before {f / b:.3f}\n")
    common.emit({"bench": f"before_after/{a.bench}", "config": {"args": args, "rounds": a.rounds,
                 "before": [r[a.metric] for r in res["before"]], "after": [r[a.metric] for r in res["after"]]},
                 "myriad": f, "peer": b, "unit": a.metric, "ratio": f / b, "roofline_fraction": None}, a.json_out)


if __name__ == "__main__":
    main()
