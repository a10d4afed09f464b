"""A kernel of stages that take tickets (``cuda_chain.py``, ``cuda_layer.py``): the device
functions (tickets, waits, copies through L2: :data:`CHAIN_HEADER`) and the ticket loop
(:func:`tickets`), text for ``mx.fast.cuda_kernel``.

A stage reads what the one before wrote, so the blocks take **tickets** in order from a
counter (``ctl[0]``; a block claims its next ticket while it works on one) rather than
by their index, and count each stage's tickets done (``ctl[32]``, ``ctl[64]``, ...: each
counter on a cache line of its own); a block waits for a stage only when it holds a
ticket of the next. Every ticket of the stage waited for is held by a block that is
running (a block works on its lower ticket first), so no wait depends on a block the GPU
has not started: no deadlock, whatever the grid and however many blocks are resident
(the decoupled look-back's argument). A wait longer than about 2^32 cycles traps (a CUDA
error, not a hang). Values another block wrote are read through L2 (``__ldcg``). The
last block to leave sets the counters back to zero (segc's are fresh at each call all
the same: ``scratch.py``). Importing needs
no GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# the chain's device functions (tickets, waits, copies through L2); public for
# benchmarks/chain_device.py's probe of the tickets alone
CHAIN_HEADER = r"""
template <int N> struct segc_bits;
template <> struct segc_bits<2> { using type = unsigned short; };
template <> struct segc_bits<4> { using type = unsigned int; };

__device__ __forceinline__ bool segc_lead() { return threadIdx.x == 0 && threadIdx.y == 0; }

// a value another block wrote in this launch, read through L2
template <typename T>
__device__ __forceinline__ T segc_l2(const T* p) {
  using U = typename segc_bits<sizeof(T)>::type;
  U b = __ldcg(reinterpret_cast<const U*>(p));
  return *reinterpret_cast<T*>(&b);
}

// `m` words other blocks wrote, into shared memory: each thread's loads all issued
// before its stores (a store to `dst` could otherwise hold back the next load, and the
// copy would wait on L2 once a word)
template <typename W>
__device__ __forceinline__ void segc_copy(W* dst, const W* src, int m) {
  constexpr int U = 4;
  const int t = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
  for (int base = t; base < m; base += U * nt) {
    W v[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      if (base + j * nt < m) {
        v[j] = __ldcg(src + base + j * nt);
      }
    }
#pragma unroll
    for (int j = 0; j < U; ++j) {
      if (base + j * nt < m) {
        dst[base + j * nt] = v[j];
      }
    }
  }
}

// `n` values other blocks wrote, into shared memory (16 bytes a load where aligned;
// `dst` is)
template <typename T>
__device__ void segc_fetch(T* dst, const T* src, int n) {
  const int bytes = n * static_cast<int>(sizeof(T));
  if (bytes % 16 == 0 && reinterpret_cast<size_t>(src) % 16 == 0) {
    segc_copy<uint4>(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), bytes / 16);
  } else {
    using U = typename segc_bits<sizeof(T)>::type;
    segc_copy<U>(reinterpret_cast<U*>(dst), reinterpret_cast<const U*>(src), n);
  }
  __syncthreads();
}

// this block's ticket done: its writes seen device-wide first
__device__ void segc_done(uint32_t* cnt) {
  __threadfence();
  __syncthreads();
  if (segc_lead()) {
    atomicAdd(cnt, 1u);
  }
}

// wait until a stage's tickets are all done; each is held by a running block
__device__ void segc_wait(const uint32_t* cnt, uint32_t want) {
  if (segc_lead()) {
    const long long start = clock64();
    unsigned pause = 32;  // backing off: many blocks may poll one counter
    while (*reinterpret_cast<const volatile uint32_t*>(cnt) < want) {
      __nanosleep(pause);
      pause = pause < 512 ? 2 * pause : pause;
      if (clock64() - start > (1ll << 32)) {
        __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}
"""


def tickets(stages: Sequence[tuple[str, str, str]], mark: Callable[[str, int], str] | None = None) -> str:
    """The ticket loop of a kernel of stages (module docstring), each stage
    ``(tickets, once, body)``: the C++ expression of its number of tickets (``RPB`` rows
    each; it may read the inputs' shapes), the text a block runs before its first ticket of the stage once the stage
    before is done (none for the first), the text of one ticket (its rows start at
    ``row``). At most :data:`STAGES`; the counters at ``ctlin``: the tickets', each
    stage's done (but the last's), the blocks gone. ``mark(point, stage)``: text put at
    each of the loop's points (``begin``, ``wait``, ``waited``, ``once``, ``ticket``, ``end``,
    ``exit``; the benchmarks' stamps). Public for benchmarks/chain_device.py's probes."""
    at = mark or (lambda point, k: "")
    n = len(stages)
    if not 1 <= n <= STAGES:
        raise ValueError(f"a chain has 1 to {STAGES} stages, not {n}")
    ends = [f"E{k}" for k in range(n)]
    consts = "".join(
        f"    const uint32_t {e} = {ends[k - 1] + ' + ' if k else ''}({count});\n"
        for k, (e, (count, _, _)) in enumerate(zip(ends, stages))
    )
    waited = "".join(f"    bool waited{k} = false;\n" for k in range(1, n))
    branches = []
    for k, (_, once, body) in enumerate(stages):
        head = ("" if k == 0 else "else ") + (f"if (tk < {ends[k]}) " if k < n - 1 else "")
        wait = (
            f"""            if (!waited{k}) {{
{at("wait", k)}                segc_wait(ctl + {k} * LINE, {ends[k - 1]} - {ends[k - 2] if k > 1 else "0"});
{at("waited", k)}{once}
{at("once", k)}                waited{k} = true;
            }}
"""
            if k
            else ""
        )
        first = ends[k - 1] if k else "0"
        done = f"            segc_done(ctl + {k + 1} * LINE);\n" if k < n - 1 else ""
        branches.append(
            f"""        {head}{{
{wait}{at("ticket", k)}            const int row = (tk - {first}) * RPB + threadIdx.y;
{body}
{done}        }}"""
        )
    loop = "\n".join(branches).replace("\n\n", "\n")
    return f"""
    uint32_t* ctl = const_cast<uint32_t*>(ctlin);
    constexpr int LINE = 32;  // each counter on a cache line of its own
{consts}    __shared__ uint32_t ticket;
{waited}    if (segc_lead()) {{
        ticket = atomicAdd(ctl, 1u);
    }}
    __syncthreads();
    uint32_t tk = ticket, next = 0;
    __syncthreads();
{at("begin", -1)}    while (tk < {ends[-1]}) {{
        if (segc_lead()) {{
            next = atomicAdd(ctl, 1u);  // the next ticket, claimed while this one runs
        }}
{loop}
        __syncthreads();  // (every warp done with `ticket` and with this ticket's rows)
{at("end", -1)}        if (segc_lead()) {{
            ticket = next;
        }}
        __syncthreads();
        tk = ticket;
    }}
    if (segc_lead()) {{
        __threadfence();
        if (atomicAdd(ctl + {n} * LINE, 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {{
            for (int k = 0; k <= {n}; ++k) {{
                ctl[k * LINE] = 0u;  // the last block gone: ready for the next call
            }}
            __threadfence();
        }}
    }}
{at("exit", -1)}"""


STAGES = 5  # the most a kernel has: the attention, the MLP's three, the next normed product


COUNTERS = (STAGES + 1) * 32  # the counters (tickets, stages done, blocks gone), each on a 128-byte line (LINE words)
