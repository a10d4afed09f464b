"""Make the header MLX's CPU build includes in each kernel it compiles a precompiled
header (``make install`` runs this; the same machine code, see below).

MLX compiles every new fused CPU kernel (``mx.compile``, so every segment segc compiles
on the CPU) with ``g++``, into ``$TMPDIR/mlx``; each compile parses
``mlx/backend/cpu/compiled_preamble.h`` again, about 1 s of a kernel's 1.2 s. The test
suite makes some 800 such kernels on a fresh machine. GCC uses ``compiled_preamble.h.gch``
beside the header wherever it was made with the same compiler and flags, and ignores it
otherwise, so this script learns MLX's own command (a ``g++`` on ``PATH`` that notes its
arguments, for one kernel), makes the ``.gch`` with those flags, and checks that GCC then
takes it (``-H`` prints ``! <path>.gch``). Measured here: 0.26 s a kernel, the objects'
code the same as without. Exit status 0 with a message when there is nothing to do (no
``g++``, or MLX's preamble not read from its installed headers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = (
    "import mlx.core as mx\n"
    "mx.set_default_device(mx.cpu)\n"
    "f = mx.compile(lambda x: mx.exp(x) * 3 + 1)\n"
    "mx.eval(f(mx.ones((5,))))\n"
)


def mlx_command(gxx: str, work: Path) -> list[str]:
    """The arguments of MLX's ``g++`` for one kernel (its source and output included)."""
    bin_dir, log = work / "bin", work / "args"
    bin_dir.mkdir()
    wrapper = bin_dir / "g++"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{log}"\nexec "{gxx}" "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(work))
    subprocess.run([sys.executable, "-c", PROBE], env=env, check=True, timeout=300)
    if not log.exists():
        raise SystemExit("mlx_pch: MLX compiled no kernel with g++ (its CPU build's compiler is another)")
    return log.read_text().splitlines()


def main() -> int:
    gxx = shutil.which("g++")
    if gxx is None:
        print("mlx_pch: no g++: nothing to precompile")
        return 0
    with tempfile.TemporaryDirectory() as d:
        args = mlx_command(gxx, Path(d))
        if "-I" not in args:
            print("mlx_pch: MLX's kernels include no installed header: nothing to precompile")
            return 0
        header = Path(args[args.index("-I") + 1]) / "mlx" / "backend" / "cpu" / "compiled_preamble.h"
        source = next(a for a in args if a.endswith(".cpp"))
        out = args.index("-o")
        flags = [a for i, a in enumerate(args) if a not in ("-shared", source) and i not in (out, out + 1)]
        gch = header.with_name(header.name + ".gch")
        tmp = gch.with_suffix(f".gch.{os.getpid()}")
        subprocess.run([gxx, *flags, "-x", "c++-header", str(header), "-o", str(tmp)], check=True, timeout=300,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        os.replace(tmp, gch)
        probe = Path(d) / "probe.cpp"  # (MLX's own source is gone: it compiles a temporary name)
        probe.write_text('#include "mlx/backend/cpu/compiled_preamble.h"\nint segc_probe() { return 0; }\n')
        cmd = [gxx, *flags, "-shared", str(probe), "-o", str(probe.with_suffix(".so")), "-H"]
        check = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if f"! {gch}" not in check.stderr:
            gch.unlink()
            print(f"mlx_pch: g++ did not take {gch} for MLX's command; removed it")
            return 1
    print(f"mlx_pch: {gch} ({gch.stat().st_size >> 20} MB), taken by MLX's g++ command")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
