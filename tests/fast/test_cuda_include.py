"""segc hands MLX its CUDA kernels' header and body as ``#include`` lines of files that
hold them (``segc.lower.cuda_kernel.included``): MLX hashes a custom kernel's whole text
at every evaluation. What NVRTC compiles must not change: the file holds the text
exactly, a real preprocessor (``g++ -E``) makes the same tokens of the kernel with the
text included as with it written out, inside a function's body too, and MLX still sees
every ``<input>_shape`` the body mentions (it passes shapes only to kernels whose source
names them). Whether NVRTC reads a file by its absolute path is checked on a GPU
(``benchmarks/gpu_decode.sh check``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.errors import UsageError
from segc.lower import cuda_kernel
from segc.lower.cuda_kernel import compact, expand, included

pytestmark = pytest.mark.timeout(120)

GXX = shutil.which("g++")
BODY = "int i = threadIdx.x;\nout[i] = a[i] * a_shape[0];\n#pragma unroll 4\nfor (int j = 0; j < 4; ++j) { out[i] += 1; }\n"
HEADER = "#define SEGC_TWO 2\ntemplate <typename T> __device__ T twice(T x) { return x * SEGC_TWO; }\n"


@pytest.fixture(autouse=True)
def _own_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SEGC_CUDA_INCLUDE_DIR", str(tmp_path / "inc"))
    monkeypatch.delenv("SEGC_CUDA_INCLUDE", raising=False)


def test_the_file_holds_the_text_and_mlx_sees_the_names(tmp_path) -> None:
    text = included(BODY, ["a_shape", "a_strides", "b_shape"])
    line = text.splitlines()[0]
    m = re.fullmatch(r'#include "(.+)"', line)
    assert m is not None
    path = Path(m.group(1))
    assert path.is_absolute() and path.parent == tmp_path / "inc"
    assert path.read_text() == BODY
    assert "a_shape" in text and "a_strides" not in text and "b_shape" not in text
    assert len(text) < 80 + len(str(path)) < len(BODY) + len(str(path))
    assert expand(text) == BODY
    assert included(BODY) == text.split("// uses")[0]  # the same file, named by its text


def test_a_file_changed_behind_segc_is_written_again(tmp_path) -> None:
    cuda_kernel._written.cache_clear()
    path = Path(re.findall(r'"(.+)"', included(HEADER))[0])
    path.write_text("garbage")
    cuda_kernel._written.cache_clear()  # a new process
    assert expand(included(HEADER)) == HEADER


def test_off_unwritable_and_bad_settings(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SEGC_CUDA_INCLUDE", "0")
    assert included(BODY) == BODY
    monkeypatch.setenv("SEGC_CUDA_INCLUDE", "yes")
    with pytest.raises(UsageError, match="SEGC_CUDA_INCLUDE must be 0 or 1, not 'yes'"):
        included(BODY)
    monkeypatch.setenv("SEGC_CUDA_INCLUDE", "1")
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("SEGC_CUDA_INCLUDE_DIR", str(blocker / "sub"))  # cannot be made
    assert included(BODY + "// 1\n") == BODY + "// 1\n"
    monkeypatch.setenv("SEGC_CUDA_INCLUDE_DIR", str(tmp_path / 'quo"te'))  # cannot stand in an #include
    assert included(BODY + "// 2\n") == BODY + "// 2\n"
    assert included("") == ""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # another user could replace the files NVRTC compiles
    monkeypatch.setenv("SEGC_CUDA_INCLUDE_DIR", str(shared / "inc"))
    assert included(BODY + "// 3\n") == BODY + "// 3\n"
    shared.chmod(0o700)
    assert included(BODY + "// 4\n").startswith("#include")


def _tokens(text: str) -> list[str]:
    """``g++ -E``'s output without its line markers, as tokens."""
    assert GXX is not None
    res = subprocess.run([GXX, "-E", "-P", "-x", "c++", "-"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    return re.findall(r"\w+|\S", res.stdout)


@pytest.mark.skipif(GXX is None, reason="needs g++ as the preprocessor")
def test_a_preprocessor_makes_the_same_tokens() -> None:
    def kernel(header: str, body: str) -> str:
        return header + "void k(int* out, const int* a, const int* a_shape) {\n" + body + "}\nint z = twice(1);\n"

    inline = _tokens(kernel(HEADER, BODY))
    assert "SEGC_TWO" not in inline and "twice" in inline  # the macro expanded: the header was read
    assert _tokens(kernel(included(HEADER), included(BODY, ["a_shape"]))) == inline


_LINE = st.sampled_from(["int x = 1;", "#define K 3", "y += K;", "  z( a, b );", "// note", "", "#pragma unroll"])


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINE, max_size=10))
def test_expand_undoes_included(lines: list[str]) -> None:
    text = compact("\n".join(lines))
    assert expand(included(text, ["a_shape"])) == text
