"""The one-kernel decode attention's merge (``cuda_attention.py``, ``cuda_kvattention.py``):
the last block of a (batch, KV head) group merges the group's chunks, as ``combine``
does, with its loads issued together.

Inside a decode step the merge cost more than the chunks: 35 µs a layer for the one
kernel against 13 for the chunks and 7 for ``combine`` as two kernels (an H100, CUPTI's
records: docs/performance-log.md). ``combine`` spreads a group's rows over many blocks; here
one block does them, and a thread that reads a row's partial results one chunk after
another from L2 waits once a round of eight for each of its rows. So the block first
reads the group's maxima and sums of exponentials into shared memory, all threads at
once, a tile of ``TS`` chunks at a time; a thread a row takes the row's maximum and
weights; then each thread reads its elements' weighted sums a batch of chunks at a
time, every load of a batch before its first use.

The arithmetic is ``combine``'s in the same order: the maximum of the chunks' maxima
(exact in any order), the weight of chunk ``c`` ``expf(m_c - max)``, the sums
``den += l_c * w_c`` and ``num += o_c * w_c`` over the chunks in order, ``num / den``:
the same bits as the two kernels (``tests/test_cuda_emulated.py``,
``tests/test_attention_cuda.py``). A row whose mask hides every key gets the mean of the
values, as there.
"""

from __future__ import annotations

# the group's blocks count themselves done on its counter; all but the last return, and
# the last sets the counter back to zero (a counter handed to launch after launch stays
# ready; segc's own are fresh at each call, scratch.py); both tails begin so. Every
# thread fences (a fence a block by its first thread alone, as cooperative groups' grid
# barrier does, measured no faster on two H100s and removed: docs/performance-log.md,
# fiftieth session)
LAST_BLOCK = r"""
    // this block's partial results, seen device-wide
    __threadfence();
    __shared__ bool last;
    __syncthreads();
    uint32_t* cnt = const_cast<uint32_t*>(count);
    if (t == 0) last = atomicAdd(cnt + bh, 1u) == (uint32_t)(S - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (t == 0) cnt[bh] = 0u;            // ready for the next call
"""


# after the first kernel's body (``cuda_attention._PARTIAL``): ``pm``, ``pl``, ``po`` the
# group's partial results, ``SEGC_LD`` a read of them from L2, ``SEGC_VBUF`` the values
FAST_TAIL = (
    LAST_BLOCK
    + r"""
    // a query row of the group: its row of the partial results and of the output
    auto row_of = [&](int r) { return ((size_t)(b * HQ + hk * REP + r / L) * L + r % L); };
    constexpr int TS = (512 / R) < 1 ? 1 : ((512 / R) > 64 ? 64 : 512 / R);  // chunks a tile
    constexpr int ITEMS = (R * D + NT - 1) / NT;                             // a thread's (row, d)
    constexpr int BATCH = ITEMS >= 32 ? 1 : 32 / ITEMS;                      // chunks a batch of loads
    __shared__ float tw[R][TS];          // a tile's maxima, then weights
    __shared__ float tl[R][TS];          // a tile's sums of exponentials
    __shared__ float rmax[R], rden[R];
    for (int r = t; r < R; r += NT) { rmax[r] = NEG_INF; rden[r] = 0.f; }
    // the rows' maxima, a tile at a time
    for (int c0 = 0; c0 < S; c0 += TS) {
        const int tn = min(TS, S - c0);
        __syncthreads();
        for (int i = t; i < R * tn; i += NT) {
            const int r = i / tn, c = i % tn;
            const size_t row = row_of(r);
            tw[r][c] = SEGC_LD(pm + row * S + c0 + c);
        }
        __syncthreads();
        for (int r = t; r < R; r += NT) {
            float m = rmax[r];
            #pragma unroll 8
            for (int c = 0; c < tn; ++c) m = fmaxf(m, tw[r][c]);
            rmax[r] = m;
        }
    }
    float num[ITEMS];
    #pragma unroll
    for (int k = 0; k < ITEMS; ++k) num[k] = 0.f;
    // the weights and the sums, a tile at a time, the chunks in order
    for (int c0 = 0; c0 < S; c0 += TS) {
        const int tn = min(TS, S - c0);
        __syncthreads();
        for (int i = t; i < R * tn; i += NT) {
            const int r = i / tn, c = i % tn;
            const size_t row = row_of(r);
            const float mr = rmax[r];
            tw[r][c] = mr == NEG_INF ? 0.f : expf(SEGC_LD(pm + row * S + c0 + c) - mr);
            tl[r][c] = SEGC_LD(pl + row * S + c0 + c);
        }
        __syncthreads();
        for (int r = t; r < R; r += NT) {
            float den = rden[r];
            #pragma unroll 8
            for (int c = 0; c < tn; ++c) den += tl[r][c] * tw[r][c];
            rden[r] = den;
        }
        for (int cb = 0; cb < tn; cb += BATCH) {
            float o[BATCH][ITEMS];
            #pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                #pragma unroll
                for (int k = 0; k < ITEMS; ++k) {
                    const int i = t + k * NT;
                    if (cb + u < tn && i < R * D) {
                        const int r = i / D, d = i % D;
                        const size_t row = row_of(r);
                        o[u][k] = SEGC_LD(po + (row * S + c0 + cb + u) * D + d);
                    }
                }
            }
            #pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                #pragma unroll
                for (int k = 0; k < ITEMS; ++k) {
                    const int i = t + k * NT;
                    if (cb + u < tn && i < R * D) num[k] += o[u][k] * tw[i / D][cb + u];
                }
            }
        }
    }
    __syncthreads();
    const int grp = bh;
    #pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = t + k * NT;
        if (i >= R * D) continue;
        const int r = i / D, d = i % D;
        const size_t row = row_of(r);
        float res;
        if (rmax[r] == NEG_INF) {
            const T* vc = SEGC_VBUF + ((size_t)grp * C) * D + d;
            float acc = 0.f;
            for (int j = 0; j < C; ++j) acc += static_cast<float>(vc[(size_t)j * D]);
            res = acc / C;
        } else {
            res = num[k] / rden[r];
        }
        out[row * D + d] = static_cast<T>(res);
    }
"""
)
