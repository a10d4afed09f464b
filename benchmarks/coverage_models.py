"""Try every architecture of the installed mlx-lm through segc; write the coverage table.

    .venv/bin/python benchmarks/coverage_models.py            # all, table into docs/models.md
    .venv/bin/python benchmarks/coverage_models.py llama phi3 # some, print only

For each ``mlx_lm/models/<arch>.py`` with a ``Model``: build it from a tiny random
configuration (segc.models.zoo), prefill 9 tokens and decode 4 greedily with the
model's own cache, eagerly and through ``segc.jit(model, boundaries="auto")``, and
compare logits and caches with ``mx.array_equal``. Each architecture runs in its own
process (a crash or a hang is reported, not fatal).

Outcomes: ``passed`` (bit-identical, no retrace per decode token), ``passed, exact
state`` (bit-identical; the cache is not one segc serves dynamically, so each token
retraces), ``differs`` (runs, not bit-identical), ``refused`` (segc raised: the
reason names the primitive or feature), ``not built`` (no tiny configuration: the
architecture needs fields or files segc's generic config does not provide).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- coverage:begin -->", "<!-- coverage:end -->"
PROMPT, DECODE = 9, 4


def architectures() -> list[str]:
    import mlx_lm.models as pkg

    names = []
    for p in sorted(Path(pkg.__path__[0]).glob("*.py")):
        src = p.read_text()
        if p.stem.startswith("_") or "class Model(" not in src or "class ModelArgs" not in src:
            continue
        names.append(p.stem)
    return names


def _same_cache(a: object, b: object) -> bool:
    import mlx.core as mx

    if type(a) is not type(b):
        return False
    va, vb = vars(a), vars(b)
    if va.keys() != vb.keys():
        return False
    for k, x in va.items():
        y = vb[k]
        if isinstance(x, mx.array):
            if not isinstance(y, mx.array) or x.shape != y.shape or not mx.array_equal(x, y).item():
                return False
        elif isinstance(x, list | tuple):
            if len(x) != len(y):
                return False
            for p, q in zip(x, y):
                if isinstance(p, mx.array):
                    if not isinstance(q, mx.array) or not mx.array_equal(p, q).item():
                        return False
                elif hasattr(p, "__dict__"):
                    if not _same_cache(p, q):
                        return False
                elif p != q:
                    return False
        elif hasattr(x, "__dict__") and not isinstance(x, type):
            if not _same_cache(x, y):
                return False
        elif x != y:
            return False
    return True


def _short(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
    msg = re.sub(r"\s+", " ", msg)
    return msg[:160]


def try_one(arch: str) -> dict:
    """Run one architecture (in this process); returns a result record."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    import segc
    from segc.models.zoo import build

    rec: dict = {"arch": arch}
    t0 = time.perf_counter()
    try:
        model = build(arch)
        vocab = model.args.vocab_size if hasattr(model, "args") and hasattr(model.args, "vocab_size") else 100
        prompt = mx.array([[(7 * i + 3) % min(vocab, 100) for i in range(PROMPT)]])
        ce = make_prompt_cache(model)
        logits_e = [model(prompt, cache=ce)]
        for _ in range(DECODE):
            logits_e.append(model(mx.argmax(logits_e[-1][:, -1:], -1), cache=ce))
        mx.eval(logits_e)
    except Exception as exc:
        rec.update(status="not built", reason=_short(exc))
        return rec
    rec["layers"] = len(getattr(model, "layers", []))
    rec["caches"] = sorted({type(c).__name__ for c in ce})
    dynamic_failed = ""
    for mode in ("auto", "exact"):
        try:
            step = segc.jit(model, boundaries="auto", state_mode=mode)
            cs = make_prompt_cache(model)
            logits_s = [step(prompt, cache=cs)]
            for _ in range(DECODE):
                logits_s.append(step(mx.argmax(logits_s[-1][:, -1:], -1), cache=cs))
            mx.eval(logits_s)
            break
        except Exception as exc:
            why = _short(exc) if isinstance(exc, segc.SegcError) else "(not a segc error) " + _short(exc)
            if mode == "auto" and not isinstance(exc, segc.UnsupportedPrimitive):
                dynamic_failed = why  # the dynamic KV stand-in may be what failed: try exact state
                continue
            if dynamic_failed and dynamic_failed != why:
                why = f"{why}; with dynamic caches: {dynamic_failed}"
            rec.update(status="refused", reason=why)
            return rec
    same_logits = all(mx.array_equal(a, b).item() for a, b in zip(logits_e, logits_s))
    same_cache = len(ce) == len(cs) and all(_same_cache(a, b) for a, b in zip(ce, cs))
    info = step.cache_info()
    rec["traces"] = info.traces
    entries = step.entries()
    rec["segments"] = len(entries[0].segments) if entries else 0
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    if not (same_logits and same_cache):
        diff = max(mx.abs(a - b).max().item() for a, b in zip(logits_e, logits_s) if a.shape == b.shape)
        rec.update(
            status="differs",
            reason=f"logits identical: {same_logits}, caches identical: {same_cache}, max |logit diff| {diff:.3g}",
        )
    elif dynamic_failed:
        rec.update(status="passed, exact state", reason=f"the dynamic KV cache failed: {dynamic_failed}")
    elif info.traces > 2:
        why = info.retraces[-1][:120]
        rec.update(status="passed, exact state", reason=f"{info.traces} traces for {DECODE + 1} calls: {why}")
    else:
        rec.update(status="passed", reason="")
    return rec


def run_isolated(arch: str, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--one", arch]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"arch": arch, "status": "refused", "reason": f"timed out after {timeout:.0f} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    err = ((p.stderr.strip() or p.stdout.strip()).splitlines() or ["no output"])[-1]
    status = "not built" if "install" in err else "refused"
    if p.returncode < 0:  # killed by a signal: MLX aborted (e.g. heap corruption)
        err = f"process aborted by signal {-p.returncode}; last output: {err}"
    return {"arch": arch, "status": status, "reason": f"crashed (exit {p.returncode}): {err[:160]}"}


def table(results: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    import mlx.core as mx
    import mlx_lm

    lines = [
        f"mlx-lm {mlx_lm.__version__}, MLX {mx.__version__} ({mx.default_device()}): "
        f"{len(results)} architectures tried; "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        + ".",
        "",
        "| architecture | result | caches | traces | reason |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        caches = ", ".join(r.get("caches", []))
        lines.append(f"| `{r['arch']}` | {r['status']} | {caches} | {r.get('traces', '')} | {r.get('reason', '')} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if argv[:1] == ["--one"]:
        print(json.dumps(try_one(argv[1])))
        return 0
    names = argv or architectures()
    jobs = int(os.environ.get("SEGC_COVERAGE_JOBS", "2"))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda a: run_isolated(a, 120.0), names))
    for r in results:
        print(f"{r['arch']:24s} {r['status']:20s} {r.get('reason', '')}")
    text = table(results)
    print(f"\n{len(results)} architectures in {time.perf_counter() - t0:.0f} s")
    if not argv:
        doc = DOC.read_text() if DOC.exists() else f"{BEGIN}\n{END}\n"
        if BEGIN not in doc:
            doc += f"\n{BEGIN}\n{END}\n"
        head, rest = doc.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
        print(f"wrote the table into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
