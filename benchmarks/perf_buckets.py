"""Sum a flat ``perf report --sort dso,sym`` (``gpu_decode.sh perf``'s ``perf_<variant>.txt``)
into a few kinds of host work, per decode call (issue 13): the share of the main thread's
samples in each kind, and what that is in microseconds a call (the main thread's sampled
CPU time, from the first report's event count (nanoseconds of ``cpu-clock``) and the
main thread's share of it, over the calls made).

    python benchmarks/perf_buckets.py perf_eager.txt perf_compile.txt perf_frozen.txt

The kinds are read from symbol and library names (first match wins, in the order below);
what no rule names is "other". A report limited to its top lines (``head``) leaves the
rest out of every kind: the share listed is printed with the kinds.
"""

from __future__ import annotations

import argparse
import re
import statistics

KINDS = (
    ("hashing a custom kernel's text", r"_Hash_bytes"),
    ("CUDA driver and runtime", r"libcuda|libcudart|cudaGraph|cuGraph|libnvrtc"),
    ("locks", r"pthread_mutex|pthread_rwlock|futex|pthread_cond"),
    (
        "allocation",
        r"\bmalloc\b|cfree|_int_malloc|_int_free|calloc|operator new|operator delete|CudaAllocator|"
        r"unlink_chunk|malloc_consolidate|realloc",
    ),
    # a stripped libc (Ubuntu's) shows its local functions by address: malloc's internals,
    # the string and memory routines
    ("libc, unnamed", r"libc\.so\.6\s+\[\.\] 0x"),
    (
        "compiled call (MLX replays the tape)",
        r"compile_replace|CompileCache|compile_|make_arrays|ArrayDesc::init|ArrayDesc::ArrayDesc|array::array\b",
    ),
    (
        "evaluation and encoding (MLX)",
        r"eval_impl|gpu::eval|eval_gpu|::eval\b|CommandEncoder|get_command_encoder|detach|release|~array|~ArrayDesc|"
        r"shared_count|_Sp_counted|copy_shared_buffer|JitModule|Event::|scheduler|prepare_slice|fmt::",
    ),
    ("Python (segc, mlx-lm, bindings)", r"python3|libpython|core\.cpython|\bpy::|perf-\d+\.map"),
    ("operating system", r"\[kernel\.kallsyms\]|\[vdso\]|ld-linux|__tls_get_addr"),
    ("C++ containers", r"libstdc\+\+|_Hashtable|_Rb_tree|std::vector|_Map_base|SmallVector|basic_string"),
)
_ROW = re.compile(r"^\s+([0-9.]+)%\s+(.*)$")


def main_thread_ns(text: str) -> float | None:
    """The main thread's sampled CPU time in ns: the first report's event count times the
    share of its rows whose pid is the one ``native_profile.py`` printed."""
    pid = re.search(r"^pid (\d+)$", text, re.M)
    count = re.search(r"Event count \(approx\.\): (\d+)", text)
    if not pid or not count:
        return None
    share = sum(float(m.group(1)) for m in re.finditer(rf"^\s+([0-9.]+)%\s+{pid.group(1)}:", text, re.M))
    return int(count.group(1)) * share / 100


def buckets(text: str) -> tuple[dict[str, float], float, str]:
    """Per kind: its percentage of the samples; the percentage listed; the call line."""
    out = {name: 0.0 for name, _ in KINDS} | {"other": 0.0}
    listed, calls = 0.0, ""
    section = 0
    for line in text.splitlines():
        if " calls in " in line:
            calls = line.strip()
        if line.startswith("# Overhead") and "Symbol" in line:
            section += 1  # the dso,sym report (the first with symbols)
        m = _ROW.match(line)
        if section != 1 or not m:
            continue
        pct, what = float(m.group(1)), m.group(2)
        listed += pct
        for name, pattern in KINDS:
            if re.search(pattern, what):
                out[name] += pct
                break
        else:
            out["other"] += pct
    return out, listed, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args()
    rows = []
    for path in a.reports:
        with open(path) as f:
            text = f.read()
        got, listed, calls = buckets(text)
        host = re.search(r"host until return ([0-9.]+) ms", calls)
        wall = re.search(r"median wall ([0-9.]+) ms", calls)
        n = re.search(r"(\d+) calls in", calls)
        ns = main_thread_ns(text)
        per_call = ns / int(n.group(1)) / 1e3 if ns and n else None
        rows.append(
            (
                path,
                got,
                listed,
                float(host.group(1)) if host else None,
                float(wall.group(1)) if wall else None,
                per_call,
            )
        )
    names = [name for name, _ in KINDS] + ["other"]
    print("share of the main thread's samples (%); per report: calls' median wall and host time")
    print(f"{'kind':40}" + "".join(f"{r[0].rsplit('/', 1)[-1]:>20}" for r in rows))
    for name in names:
        print(f"{name:40}" + "".join(f"{r[1][name]:20.1f}" for r in rows))
    print(f"{'listed':40}" + "".join(f"{r[2]:20.1f}" for r in rows))
    print(f"{'wall ms':40}" + "".join(f"{r[4] or float('nan'):20.3f}" for r in rows))
    print(f"{'host until return ms':40}" + "".join(f"{r[3] or float('nan'):20.3f}" for r in rows))
    print(f"{'main thread, us a call':40}" + "".join(f"{r[5] or float('nan'):20.0f}" for r in rows))
    print("the same kinds in us a call (the main thread's CPU time times each share):")
    for name in names:
        print(f"{name:40}" + "".join(f"{(r[5] or float('nan')) * r[1][name] / 100:20.0f}" for r in rows))
    if len(rows) > 1:
        print("median listed share:", f"{statistics.median(r[2] for r in rows):.1f}%")


if __name__ == "__main__":
    main()
