#!/usr/bin/env python3
"""Lines of code per backend slot in the CPU backend (the figure docs/backends.md quotes).

For each slot, the lines of the function the portable table (impl/fill_ops.h)
installs, from its signature to its closing brace; shared helpers are counted
once per file in the totals. Usage: python3 scripts/backend_lines.py [SRC_DIR]
"""
import re
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
CPU = SRC / "src/backend/cpu"


def function_lines(path, name):
    lines = path.read_text().split("\n")
    for i, line in enumerate(lines):
        if re.search(r"\b%s\s*\(" % re.escape(name), line) and not line.lstrip().startswith(("//", "o->", "ops->")) \
                and re.match(r"\s*(inline |static |void |double |template)", line):
            depth, opened = 0, False
            for j in range(i, len(lines)):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if opened and depth == 0:
                    return j - i + 1
    return None


def main():
    fill = (CPU / "impl/fill_ops.h").read_text()
    table = dict(re.findall(r"o->(\w+) = (\w+);", fill))
    where = {}
    for f in list((CPU / "impl").glob("*.h")) + [CPU / "blas.cc", CPU / "host_memory.cc"]:
        for slot, fn in table.items():
            n = function_lines(f, fn)
            if n and slot not in where:
                where[slot] = (f.relative_to(SRC), fn, n)
    for slot, (f, fn, n) in where.items():
        print(f"{slot:18s} {n:4d}  {f}:{fn}")
    simd_impl = {"flash_simd.h", "elementwise_simd.h"}
    portable = sorted("impl/" + f.name for f in (CPU / "impl").glob("*.h") if f.name not in simd_impl)
    portable += ["blas.cc", "host_memory.cc", "cpu_backend.cc"]
    simd = ["impl/flash_simd.h", "impl/elementwise_simd.h", "isa_avx2/gemv_avx2.cc", "isa_avx2/vec.h",
            "isa_avx2/ops_avx2.cc", "isa_avx512/gemv_avx512.cc", "isa_avx512/vec.h", "isa_avx512/ops_avx512.cc",
            "isa_avx512/gemm_bf16.cc"]
    count = lambda names: sum(len((CPU / n).read_text().split("\n")) for n in names if (CPU / n).exists())
    print(f"portable backend files: {count(portable)} lines; SIMD fast paths: {count(simd)} lines")


if __name__ == "__main__":
    main()
