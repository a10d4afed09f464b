#!/usr/bin/env bash
# Issue 13's GPU decode figures in one call (docs/performance-log.md, "GPU decode"): the
# reference llama, its 4-bit version and a mixtral of the same sizes, every variant in a
# process of its own (--isolate), then the runtime's signal/wait costs. Run on the device
# after MLX's CUDA build is staged (docs/gpu.md):
#
#   bash .gpu/two/stage && PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_decode.sh [PARTS]
#
# PARTS: any of  tune thread hostmodes reuse schedule hostsplit teststamps managed devpos live livecommits ab pool dense quant moe concat chain chaintests isolated runtime kernels select products check generate device ablate modes commits census kv attn kvattn kvattndev timeline stage tail bank layers stamps stagedecode inplace prefill prefillproducts dequantized experts experiment paging hostcost segment plandevice argcost hostkinds perf
# (default: dense runtime). tune: the commit schedule chosen at run time (SEGC_LIVE_COMMITS=tune): its tests,
# host_modes.py with it interleaved, the decode isolated (about 8 minutes; TUNE=host or TUNE=iso: either half, a device call each). chain: a layer's MLP, and a decode layer, as one kernel
# (segc.lower.cuda_chain, cuda_layer; off by default): chain_device.py (device time against
# the separate kernels, several grids, the tickets alone) and chain_stages.py (each stage's
# span, waits and work from the blocks' own stamps), each with the compiler's registers and
# fitted to 4 blocks an SM (SEGC_CHAIN_OCCUPANCY), and device_time.py's whole steps with and
# without chains (about 9 min); chaintests: their GPU tests one at a time; the decode with them is
# VARIANTS=eager,frozen,frozen+chain4,frozen+chain4occ,frozenhead+chain,frozenhead+chainocc MODELS=llama: ...
# isolated, a call of its own. kernels: fewer_kernels.py (what each kernel and each of the
# dynamic cache's differences costs); select: segc's one-position KV write as a select
# against MLX's, three models; products: segc's product kernels (segc.lower.products)
# against MLX's own kernels, the llama and the mixtral; check: the CUDA kernels' tests
# (tests/test_products_cuda.py, tests/test_kvwrite_cuda.py and the tests of what lowers to them); generate: mlx-lm's own generation loop;
# device: device_time.py (the step's products and whole steps on the GPU's clock, bf16 and 4-bit);
# ablate: device_time.py's whole steps as one CUDA graph each (the device's own time; every call's span, --spans), segc's
# step with each of its differences from eager undone, in place, and with its rotated write and attention as two kernels; modes: segc's
# whole step (and segcinplace's, segcnokv's) as one CUDA graph, every call's span, in four processes of its own (does each process hold
# one level of device time?); commits: the commit policies on a
# segment per layer, each variant a process of its own, 2 rounds; census: kernel_census.py
# (the kernels of one decode step, by name, from MLX's CUDA graphs); kv: the rotation-and-write
# kernel on and off, two rounds; attn: the decode attention as one kernel or two, two rounds; kvattn: the rotated write with its attention as one kernel (the default) or apart, two rounds; stage: the attention's chunks read into shared memory first (SEGC_ATTENTION_STAGE=1; auto, the default, stages the write in place alone) against not: the CUDA attention and write tests, timeline's steps with and without (and segcnokv's attention as its two kernels), kvattn_device.py's forms with and without, alone and after a 96-MB sum a layer (--flush: their buffers in HBM, as in a step; about 5 minutes); tail: the one kernel's merge with its loads issued together (segc.lower.cuda_merge): the CUDA attention and write tests, the steps' kernels, the decode eager,frozen,frozen+inplace+nostage,frozen+inplace in one round (about 6 minutes; the write in place is staged by default, SEGC_ATTENTION_STAGE=auto); layers: STEPS' attention kernels (default segc,segcinplace,segcnokv) layer by layer, each occurrence's duration and the gap before it (kernel_timeline.py --by-layer BYLAYER), three processes (is a slow step slow in some layers, always the same, or in some calls?; about 2 minutes); NOCACHE=1: each process again with mx.set_cache_limit(0) (no buffer of MLX's cache handed out again); stamps: kvattn_stamps.py (the write with its attention inside STEPS' steps, default segc,segcinplace and both with the queries rotated first by MLX, SEGC_FUSED_QUERY_ROPE=mlx, part by part from its blocks' stamps of the GPU's clock, SEGC_KERNEL_STAMPS=1: which part grows in a slow call), three processes (about 3 minutes); DECODE=1: then the decode eager, frozen and frozen+inplace with and without +qrope, each a process, one round (about 2 minutes more); bank: the counters' bank (segc.lower.scratch) against the tree before it, OLD (a folder holding that tree's segc/, carried: git archive 568ea14 segc | tar -x -C .gpu/old), STEPS' kernels (default segc,segcinplace,segcnokv) twice in each tree, and kvattn_device.py's forms after a 96-MB and a 2-GB sum a layer (a step reads 2 GB of weights between two attentions: whether its pages, not L2 alone, slow the attention there; about 4 minutes); stagedecode: the decode with and without (+stage), each variant a process, two rounds (about 5 minutes); timeline: kernel_timeline.py (every kernel of STEPS' decode steps, default eager,segc,segcinplace,segcnokv; MOVING=1: each call the next position, from CUPTI's records: span, kernels running, gaps, per kernel name; carry .gpu/cupti, benchmarks/stage_cupti.sh installs it); kvattndev: kvattn_device.py (the write and attention's forms per layer on the device's clock: eager's, segcnokv's select, apart, fused copying and in place, the attention alone; and how many of a lowered 16-layer step's writes are in place); inplace: that kernel writing the row into the old buffers (frozen+inplace, frozenhead+inplace: SEGC_KV_IN_PLACE=1) or copying them, beside eager, every variant a process, two rounds; prefill: 512 tokens, segc's defaults against concatenated (MODEL_ARGS="--bits 4" or "--arch mixtral" for another model); prefillproducts: prefill_products.py (a prefill's products alone against eager's prefill, three models). Logs go
# to $OUT. dequantized: the 4-bit prefill with its quantized products as the dequantized
# weights' products (segc.lower.dequantized): its tests, prefill_qmm.py (each product's device
# time, its bytes, the prefill's peak memory), 512 tokens with the form on and off
# (SEGC_DEQUANTIZED_PRODUCTS=0), 2048 tokens. experts: the mixtral's prefill with its sorted
# expert products as every token's products (segc.lower.experts): its tests, prefill_moe.py (each
# product's forms, their bytes, the prefill's peak memory), 512 tokens on and off (SEGC_DENSE_EXPERTS=0),
# 2048 tokens, and the 4-bit mixtral's at 512 (gather_qmm). experiment: issue 15's harness on the reference llama, every strategy, decode
# and prefill 512 (docs/experiments.md, "On the H200"; about 4 minutes; its plans and traced graphs
# come back as $OUT/experiment.tgz for benchmarks/repredict.py);
# paging: bench_paging.py on the reference llama's sizes, budgets 0.25, 0.5, 0.75
# (docs/performance.md, paging; the fenced pager's spread eviction); hostcost: host_cost.py
# (MLX's host time per kernel, builtin and custom, eager, compiled, in 17 commits); segment:
# segment_host.py (each segment's compiled call, commit and primitives; bf16, 4-bit, mixtral);
# plandevice: plan_device.py (each plan's device span, its own and in the pipeline: WORKLOAD, default prefill:512, or decode:1024);
# argcost: arg_cost.py (the host's time per extra input of a compiled, committed segment);
# hostkinds: host_kinds.py (the host's time per segment, per product and per elementwise kernel;
# the H200 model with them in it: $OUT/host_kinds.json, so that
# MACHINE=\$OUT/host_kinds.json OVERHEADS=device ... gpu_decode.sh hostkinds experiment predicts with them).
# perf: native_profile.py under perf (carried as .gpu/perfx/perf.tar.xz: benchmarks/pack_perf.sh),
# each of PERF_VARIANTS (eager compile frozen frozenhead frozen2) a process, its timed loop sampled at PERF_F
# (2999) Hz, PERF_G (e.g. "--call-graph dwarf,16384") adds call graphs; perf_<variant>.txt
# for benchmarks/perf_buckets.py.
# isolated: decode of the three models: segc's defaults, and concatenated and
# frozen with one segment (wholefrozen) and a segment per layer (frozen), every variant a process of its own, 2 rounds (the "variants isolated"); about
# 4 to 7 minutes a model on the H200 (BENCH_LIMIT, 450 s: a slow host needs it), so MODELS=llama: (or llama_4bit:--bits,4 or
# mixtral:--arch,mixtral) runs one model in a device call.
# VARIANTS (default eager,compile,segc,each,whole,drain; isolated: eager,compile,segc,wholefrozen,frozen), REPEATS (40), ROUNDS (1),
# BENCH_LIMIT (400 s); experiment: WORKLOADS (decode:1024,prefill:512; plandevice: WORKLOAD), PROCESSES (12), ORDER (rounds; blocks, interleaved: the timing order), OVERHEADS (group; device: calibrate the
# device's figures alone), MACHINE (a machine model JSON, e.g. with host_kinds.py's figures, or an experiment's fitted/ folder, e.g. benchmarks/machines/bu: each workload's plans, optimal's among them, made with the model that run fitted), FIT_FIRST (1: the calibration plans timed and fitted first, every plan made with that fit: this run's own optimal).
set -u
OUT="${OUT:-/tmp/segc-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-device}"  # a GPU test's failure reported as found, not shrunk (tests/conftest.py)
PY="${PY:-python3}"
parts="${*:-dense runtime}"
bench() {  # name, extra arguments
  local name=$1
  shift
  timeout "${BENCH_LIMIT:-400}" $PY benchmarks/bench_llama.py --preset reference --repeats "${REPEATS:-40}" --warmup "${WARMUP:-5}" \
    --variants "${VARIANTS:-eager,compile,segc,each,whole,drain}" --isolate --rounds "${ROUNDS:-1}" --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1
  echo "$name: rc=$?"
}
attn_tests() {  # name, workers: the CUDA attention and KV-write tests, their log $OUT/<name>_tests.txt; first
  # the machine's NVRTC (MLX compiles segc's kernels with it: which products it fuses is its choice) and driver
  $PY -c 'import ctypes, mlx.core as mx; a, b = ctypes.c_int(), ctypes.c_int()
ctypes.CDLL("libnvrtc.so.13").nvrtcVersion(ctypes.byref(a), ctypes.byref(b)); print("nvrtc", a.value, b.value, "on", mx.default_device())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2
  timeout 420 $PY -m pytest -q -p no:benchmark -p no:cacheprovider -n "$2" --timeout 400 --timeout-method thread \
    tests/test_attention_cuda.py tests/test_kvwrite_cuda.py >"$OUT/$1_tests.txt" 2>&1
  echo "$1 tests: rc=$?"
  tail -3 "$OUT/$1_tests.txt"
}
onoff() {  # name, variable, its value on, off: decode with each, every variant a process, two rounds alternating
  local name=$1 var=$2 on=$3 off=$4 r
  for r in 1 2; do
    (export "$var=$on" && VARIANTS=eager,segc,frozen REPEATS=30 BENCH_LIMIT=150 \
      bench "${name}1_$r" --prefill 0 --first-call-layers 0 --no-dispatch)
    (export "$var=$off" && VARIANTS=segc,frozen REPEATS=30 BENCH_LIMIT=100 \
      bench "${name}0_$r" --prefill 0 --first-call-layers 0 --no-dispatch)
  done
}
for p in $parts; do
  case "$p" in
  dense) bench dense ;;
  quant) bench quant --bits 4 --first-call-layers 0 --no-dispatch ;;
  moe) bench moe --arch mixtral --first-call-layers 0 --no-dispatch ;;
  concat)  # one process, interleaved: concat_projections on the llama, its 4-bit version, a mixtral
    for a in "llama" "llama --bits 4" "mixtral"; do
      set -- $a
      name="concat_$1${3:+_$3bit}"
      # compileconcat (plain MLX, weights concatenated by hand) exists for the bf16 llama only
      extra=$([ "$a" = llama ] && echo ,compileconcat)
      timeout 250 $PY benchmarks/encode_cost.py --skip-nodes --rounds 30 --arch "$@" \
        --variants "eager,compile$extra,segcauto,segcconcat,segcwhole,segcwholeconcat" >"$OUT/$name.txt" 2>&1
      echo "$name: rc=$?"
    done
    ;;
  chain)  # a layer's MLP, and a layer, as one kernel (cuda_chain, cuda_layer): device time (about 9 min)
    for occ in 0 4; do  # the compiler's registers, and the kernels fitted to 4 blocks an SM (SEGC_CHAIN_OCCUPANCY)
      SEGC_CHAIN_OCCUPANCY=$occ timeout 60 $PY benchmarks/chain_device.py --reps 8 --repeats 6 >"$OUT/chain_device_$occ.txt" 2>&1
      echo "chain device, occupancy $occ: rc=$?"
      SEGC_CHAIN_OCCUPANCY=$occ timeout 60 $PY benchmarks/chain_stages.py --repeats 8 >"$OUT/chain_stages_$occ.txt" 2>&1
      echo "chain stages, occupancy $occ: rc=$?"
    done
    for steps in segc,segcchain,segcchainocc segc,segcchain4,segcchain4occ; do  # about 35 s a step
      MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000 timeout 140 $PY benchmarks/device_time.py --skip-products \
        --repeats 10 --steps $steps >"$OUT/chain_steps_${steps##*,}.txt" 2>&1
      echo "chain steps $steps: rc=$?"
    done
    ;;
  chaintests)  # the chain's and the layer's GPU tests, one at a time, stopping at the first failure (a call of its own)
    timeout 560 $PY -m pytest -o addopts= -p no:benchmark -p no:cacheprovider -x --timeout 540 -q -rf --tb=short \
      tests/test_products_cuda.py -k "chain_is or layer_kernel_is or llama_decode" >"$OUT/chain_tests.txt" 2>&1
    echo "chain tests: rc=$?"
    ;;
  isolated)
    for spec in ${MODELS:-llama: llama_4bit:--bits,4 mixtral:--arch,mixtral}; do  # about 4 min each
      spec=${spec//,/ }
      # shellcheck disable=SC2086  # the extra arguments are meant to split
      VARIANTS=${VARIANTS:-eager,compile,segc,wholefrozen,frozen} ROUNDS=2 REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-450} \
        bench "isolated_${spec%%:*}" --prefill 0 --first-call-layers 0 --no-dispatch ${spec#*:}
    done
    ;;
  kernels)
    timeout 200 $PY benchmarks/fewer_kernels.py --rounds 30 \
      --variants base,ropeqk,inputs,dynwrite,dynrope,dynattn,dynall,dynsel,segc,segcdsu >"$OUT/kernels.txt" 2>&1
    echo "kernels: rc=$?"
    ;;
  select)
    for a in "" "--bits 4" "--arch mixtral"; do
      # shellcheck disable=SC2086  # the extra arguments are meant to split
      timeout 175 $PY benchmarks/encode_cost.py --skip-nodes --rounds 20 $a \
        --variants eager,compile,segcwholeconcat,segcwholeconcatdsu >"$OUT/select${a// /_}.txt" 2>&1
      echo "select $a: rc=$?"
    done
    ;;
  products)
    timeout 150 $PY benchmarks/fewer_kernels.py --rounds 30 --variants base,dynsel,segc,segcplain \
      >"$OUT/products_kernels.txt" 2>&1
    echo "products kernels: rc=$?"
    for a in "" "--arch mixtral"; do
      # shellcheck disable=SC2086  # the extra arguments are meant to split
      timeout 175 $PY benchmarks/encode_cost.py --skip-nodes --rounds 20 $a \
        --variants eager,compile,segcwholeconcat,segcwholeconcatplain >"$OUT/products${a// /_}.txt" 2>&1
      echo "products $a: rc=$?"
    done
    ;;
  check)
    # a test past 240 s is stopped with its stack (thread: a wait inside MLX never returns
    # to Python); the slowest are listed (on an H100 the whole took more than 300 s)
    timeout "${CHECK_LIMIT:-560}" $PY -m pytest -q -p no:benchmark -p no:cacheprovider -n 8 --timeout 240 --timeout-method thread --durations 15 tests/test_products_cuda.py tests/test_gather_cuda.py tests/test_kvwrite_cuda.py tests/test_attention_cuda.py tests/test_dequantized_cuda.py tests/test_experts_cuda.py tests/test_live_cuda.py tests/test_paging_cuda.py tests/test_kvwrite.py \
      tests/test_products.py tests/test_dequantized.py tests/test_experts.py tests/test_freeze_params.py tests/test_select_write.py tests/test_fused_attention.py \
      >"$OUT/check.txt" 2>&1
    echo "check: rc=$?"
    ;;
  generate)
    for p in 1000 32; do
      timeout 200 $PY benchmarks/bench_generate.py --layers 16 --hidden 2048 --intermediate 8192 --heads 32 \
        --kv-heads 8 --vocab 32000 --dtype bfloat16 --tokens 256 --prompt $p --rounds 2 \
        --variants eager,segc,segc-1seg,segc-1seg-concat,segc-frozen >"$OUT/generate_$p.txt" 2>&1
      echo "generate $p: rc=$?"
    done
    ;;
  device)
    for a in "" "--bits 4"; do
      # shellcheck disable=SC2086  # the extra arguments are meant to split
      timeout 200 $PY benchmarks/device_time.py $a >"$OUT/device${a// /_}.txt" 2>&1
      echo "device $a: rc=$?"
    done
    ;;
  ablate)
    MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000 timeout 180 $PY benchmarks/device_time.py \
      --skip-products --repeats 20 --spans --steps eager,compile,segc,segcinplace,segcdsu,segcplain,segcnokv,segcmlxattn,segckvapart >"$OUT/ablate.txt" 2>&1
    echo "ablate: rc=$?"
    ;;
  modes)
    for i in 1 2 3 4; do
      MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000 timeout 100 $PY benchmarks/device_time.py \
        --skip-products --repeats 40 --spans --steps segc,segcinplace,segcnokv >"$OUT/modes_$i.txt" 2>&1
      echo "modes $i: rc=$?"
    done
    ;;
  census)
    timeout 240 $PY benchmarks/kernel_census.py --steps eager,compile,segc,segcplain,segcnokv,segckvapart --top 40 --keep "$OUT/graphs" >"$OUT/census.txt" 2>&1
    echo "census: rc=$?"
    ;;
  commits)
    VARIANTS=eager,compile,wholefrozen,frozen,frozeneach,frozengeo ROUNDS=2 REPEATS=30 BENCH_LIMIT=420 \
      bench commits --prefill 0 --first-call-layers 0 --no-dispatch
    ;;
  kv)  # segc's rotation-and-write kernel on and off (SEGC_FUSED_KV_WRITE)
    onoff kv SEGC_FUSED_KV_WRITE 1 0
    ;;
  attn)  # segc's decode attention as one kernel or two (SEGC_ATTENTION_KERNELS), unpaired with the writes
    (export SEGC_FUSED_KV_ATTENTION=0 && onoff attn SEGC_ATTENTION_KERNELS 1 2)
    ;;
  inplace)  # the write with its attention in place (+inplace: kv_in_place=True) or copying the buffers (the default), two rounds
    VARIANTS=eager,frozen,frozen+inplace,frozenhead,frozenhead+inplace ROUNDS=2 REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-420} \
      bench inplace --prefill 0 --first-call-layers 0 --no-dispatch
    ;;
  timeline)  # every kernel of eager's and segc's steps on the device's clock (CUPTI; carry [".gpu/cupti"])
    lib=$(bash benchmarks/stage_cupti.sh) || { echo "timeline: no CUPTI"; exit 1; }
    PYTHONPATH="/tmp/cupti:${PYTHONPATH:-}" LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" MLX_MAX_OPS_PER_BUFFER=100000 \
      MLX_MAX_MB_PER_BUFFER=1000000 timeout 300 $PY benchmarks/kernel_timeline.py --steps "${STEPS:-eager,segc,segcinplace,segcnokv}" \
      --calls ${CALLS:-20} ${MOVING:+--moving} ${NOUVM:+--no-uvm} ${POOLKEEP:+--pool-keep} ${BYLAYER:+--by-layer "$BYLAYER"} ${CACHELIMIT:+--cache-limit "$CACHELIMIT"} >"$OUT/timeline.txt" 2>&1
    echo "timeline: rc=$?"
    ;;
  stage)  # the attention's chunks in shared memory first (SEGC_ATTENTION_STAGE=1) or not: its GPU tests, every kernel of the
    # steps (CUPTI; carry .gpu/cupti), each form alone (kvattn_device.py); about 5 minutes
    attn_tests stage 8
    STEPS=eager,segc,segcstage,segcinplacenostage,segcinplace,segcnokv,segcnokv2k,segcnokvstage bash "$0" timeline
    timeout 150 $PY benchmarks/kvattn_device.py --repeats 30 --flush 96 >"$OUT/kvattn_stage.txt" 2>&1
    echo "stage forms: rc=$?"
    ;;
  tail)  # the one kernel's merge with its loads issued together (segc.lower.cuda_merge): the CUDA attention and write
    # tests, the steps' kernels (carry .gpu/cupti), the decode with and without staging, one round (about 6 minutes)
    attn_tests tail 8
    STEPS=eager,segc,segcinplacenostage,segcinplace,segcnokv,segcnokv2k bash "$0" timeline
    VARIANTS=eager,frozen,frozen+inplace+nostage,frozen+inplace ROUNDS=1 REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-240} \
      bench tail --prefill 0 --first-call-layers 0 --no-dispatch
    ;;
  ab)  # this tree against the tree before it (OLD: a folder holding that tree's segc/, carried; git archive HEAD segc |
    # tar -x -C .gpu/old): the CUDA attention and write tests; STEPS' kernels (default eager,segc,segcinplace and the
    # latter with chunks of 64 and 128 keys) and OLDSTEPS' in OLD (segc,segcinplace), twice, alternating (carry
    # .gpu/cupti); ABPARTS=decode (or "tests timeline decode", the default): the decode,
    # VARIANTS (default eager,frozen+inplace) in this tree and OLDVARIANTS (frozen+inplace) in OLD, each a process,
    # alternating, two rounds (about 4 minutes for the tests and the kernels, 4 for the decode)
    abparts=${ABPARTS:-tests timeline decode}
    if [[ " $abparts " == *" tests "* ]]; then
      attn_tests ab 16
    fi
    if [[ " $abparts " == *" timeline "* ]]; then
      for r in 1 2; do
        NOUVM=1 STEPS=${STEPS:-eager,segc,segcinplace,segcinplacec64,segcinplacec128} bash "$0" timeline &&
          mv "$OUT/timeline.txt" "$OUT/timeline_new$r.txt"
        NOUVM=1 PYTHONPATH="$OLD:${PYTHONPATH:-}" STEPS=${OLDSTEPS:-segc,segcinplace} bash "$0" timeline &&
          mv "$OUT/timeline.txt" "$OUT/timeline_old$r.txt"
      done
      grep -H "calls; span" "$OUT"/timeline_new*.txt "$OUT"/timeline_old*.txt | cut -c1-170
    fi
    if [[ " $abparts " == *" decode "* ]]; then
      for r in 1 2; do
        VARIANTS=${VARIANTS:-eager,frozen+inplace} ROUNDS=1 REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-150} \
          bench "ab_new$r" --prefill 0 --first-call-layers 0 --no-dispatch
        PYTHONPATH="$OLD:${PYTHONPATH:-}" VARIANTS=${OLDVARIANTS:-frozen+inplace} ROUNDS=1 REPEATS=30 \
          BENCH_LIMIT=${BENCH_LIMIT:-150} bench "ab_old$r" --prefill 0 --first-call-layers 0 --no-dispatch
      done
    fi
    ;;
  teststamps)  # the CUDA attention and write tests (the rotation's fused products pinned to MLX's since the
    # fiftieth session: the float32 test must pass), then the stamps with each block's SM clock and nvidia-smi's
    # clocks beside them (does a slow call run on a slower clock?); about 5 minutes, carry .gpu/two
    attn_tests teststamps 16
    bash "$0" stamps
    ;;
  managed)  # is the step out of managed memory now (segc's host reads copy and empty MLX's cache, fifty-first
    # session), and are the slow calls gone? the CUDA attention and write tests, the stamps with the kernel's input
    # addresses (STEPS default segc,segcinplace; STAMPRUNS processes, default 2), then the reference llama's
    # decode, VARIANTS (default eager,compile,frozen,frozen+inplace,frozenhead+inplace) each a process, two rounds
    # (about 7 minutes; carry .gpu/two)
    attn_tests managed 16
    STAMPRUNS=${STAMPRUNS:-2} WHERE=1 STEPS=${STEPS:-segc,segcinplace} bash "$0" stamps | grep -v "  q:"
    VARIANTS=${VARIANTS:-eager,compile,frozen,frozen+inplace,frozenhead+inplace} ROUNDS=2 REPEATS=30 \
      BENCH_LIMIT=${BENCH_LIMIT:-300} bench managed --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A9 "=== isolated" "$OUT/managed.txt"
    ;;
  devpos)  # does the caches' offset made on the device (SEGC_DEVICE_POSITION=1: not MLX's managed scalar pool, which
    # the host writes) end the slow calls? fifty-second session: the inputs all in device memory but the offset, the
    # slow mode kept. The stamps with the input addresses (STEPS default segcinplace), the offset off and on, each a
    # process (DEVPOSRUNS, default 2, alternating), then the decode, VARIANTS (default
    # eager,frozenhead+inplace,frozenhead+inplace+devpos) each a process, two rounds (about 4 minutes; carry .gpu/two)
    for r in $(seq "${DEVPOSRUNS:-2}"); do
      for on in 0 1; do
        SEGC_DEVICE_POSITION=$on STAMPRUNS=1 WHERE=1 STEPS=${STEPS:-segcinplace} bash "$0" stamps >/dev/null
        mv "$OUT/stamps1.txt" "$OUT/stamps_devpos${on}_$r.txt"
      done
    done
    grep -H "^  fast \|^  slow \|kinds seen" "$OUT"/stamps_devpos*.txt | cut -c1-200
    grep -h " off:" "$OUT"/stamps_devpos1_*.txt | awk '{print $2, $8}' | sort | uniq -c  # the offset's kind, calls by mode
    VARIANTS=${VARIANTS:-eager,frozenhead+inplace,frozenhead+inplace+devpos} ROUNDS=2 REPEATS=30 \
      BENCH_LIMIT=${BENCH_LIMIT:-240} bench devpos --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A7 "=== isolated" "$OUT/devpos.txt"
    ;;
  live)  # the decode attention by MLX's own kernel over the live keys (SEGC_LIVE_ATTENTION, on by default: eager's
    # call, cuDNN from 256 positions): its GPU tests (a decode against eager mlx-lm byte for byte, copying and in
    # place, 12 and 300 cached positions; one segment and a segment a layer; a validated jit keeps its graph), then
    # the decode, VARIANTS (default eager, frozenhead+inplace and wholefrozen+inplace, each also +nolive: segc's
    # write-with-attention kernel; a segment a layer makes two compiled stretches a layer, one segment one) each a
    # process, two rounds (about 5 minutes; carry .gpu/two); LIVEPROFILE="0 1": also
    # benchmarks/live_host.py (the host time of a call, by function) off and on first
    timeout 300 $PY -m pytest -q -p no:benchmark -p no:cacheprovider -n 4 --timeout 280 --timeout-method thread \
      tests/test_live_cuda.py >"$OUT/live_tests.txt" 2>&1
    echo "live tests: rc=$?"
    tail -3 "$OUT/live_tests.txt"
    for on in ${LIVEPROFILE:-}; do  # the host time of a call under cProfile, SEGC_LIVE_ATTENTION=$on, in place
      SEGC_LIVE_ATTENTION=$on SEGC_KV_IN_PLACE=1 timeout 120 $PY benchmarks/live_host.py --calls 30 >"$OUT/live_host$on.txt" 2>&1
      head -30 "$OUT/live_host$on.txt"
    done
    VARIANTS=${VARIANTS:-eager,frozenhead+inplace,frozenhead+inplace+nolive,wholefrozen+inplace,wholefrozen+inplace+nolive} ROUNDS=${ROUNDS:-2} REPEATS=30 \
      BENCH_LIMIT=${BENCH_LIMIT:-300} bench live --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A9 "=== isolated" "$OUT/live.txt"
    ;;
  livecommits)  # one segment committed after every Kth live step inside it (SEGC_LIVE_COMMITS=K, default 2:
    # one compiled call between two attentions, where a segment a layer makes two): the live GPU tests with K=1
    # (eager's bytes), then the decode, VARIANTS (default eager, frozenhead+inplace and wholefrozen+inplace with
    # K = 2, 1, 4 and 0) each a process, two rounds (about 6 minutes; carry .gpu/two)
    SEGC_LIVE_COMMITS=1 timeout 300 $PY -m pytest -q -p no:benchmark -p no:cacheprovider -n 4 --timeout 280 \
      --timeout-method thread tests/test_live_cuda.py >"$OUT/livecommits_tests.txt" 2>&1
    echo "live tests, SEGC_LIVE_COMMITS=1: rc=$?"
    tail -3 "$OUT/livecommits_tests.txt"
    VARIANTS=${VARIANTS:-eager,frozenhead+inplace,wholefrozen+inplace,wholefrozen+inplace+lc1,wholefrozen+inplace+lc4,wholefrozen+inplace+lc0} \
      ROUNDS=${ROUNDS:-2} REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-400} bench livecommits --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A14 "=== isolated" "$OUT/livecommits.txt"
    ;;
  schedule)  # the commit schedule inside one segment (fifty-eighth session; SEGC_LIVE_COMMITS as group sizes, the last
    # repeated): the live GPU tests with 1,1,2 (eager's bytes), then the decode, VARIANTS (eager, wholefrozen+inplace:
    # every second attention, the default; +lc112: after the first and second, then every second; +lc3) each a
    # process, two rounds; then mlx-lm's own generation loop (eager, segc-best; PROMPTS, 1000) (about 6 minutes)
    SEGC_LIVE_COMMITS=1,1,2 timeout 300 $PY -m pytest -q -p no:benchmark -p no:cacheprovider -n 4 --timeout 280 \
      --timeout-method thread tests/test_live_cuda.py >"$OUT/schedule_tests.txt" 2>&1
    echo "live tests, SEGC_LIVE_COMMITS=1,1,2: rc=$?"
    tail -3 "$OUT/schedule_tests.txt"
    VARIANTS=${VARIANTS:-eager,wholefrozen+inplace,wholefrozen+inplace+lc112,wholefrozen+inplace+lc3} ROUNDS=${ROUNDS:-2} \
      REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-300} bench schedule --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A10 "=== isolated" "$OUT/schedule.txt"
    for p in ${PROMPTS:-1000}; do
      timeout 120 $PY benchmarks/bench_generate.py --layers 16 --hidden 2048 --intermediate 8192 --heads 32 \
        --kv-heads 8 --vocab 32000 --dtype bfloat16 --tokens 256 --prompt $p --rounds 2 \
        --variants eager,segc-best >"$OUT/generate_$p.txt" 2>&1
      echo "generate $p: rc=$?"; tail -12 "$OUT/generate_$p.txt"
    done
    ;;
  reuse)  # does a commit wait for MLX's cached CUDA graph of the same shape still running? (fifty-ninth session):
    # benchmarks/graph_reuse.py (groups of one shape, of shapes in turn; the device the faster side, then the slower),
    # then the decode, VARIANTS (eager, wholefrozen+inplace: every second attention, the default; +lc112; +lc12,
    # +lc23, +lc1123: no two consecutive groups of one shape) each a process, ROUNDS (2) (about 6 minutes)
    timeout 120 $PY benchmarks/graph_reuse.py >"$OUT/graph_reuse.txt" 2>&1
    echo "graph_reuse: rc=$?"; cat "$OUT/graph_reuse.txt"
    VARIANTS=${VARIANTS:-eager,wholefrozen+inplace,wholefrozen+inplace+lc112,wholefrozen+inplace+lc12,wholefrozen+inplace+lc23,wholefrozen+inplace+lc1123} \
      ROUNDS=${ROUNDS:-2} REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-420} bench reuse --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A12 "=== isolated" "$OUT/reuse.txt"
    ;;
  thread)  # commits on a thread of their own (sixtieth session, segc.committer): plain MLX first
    # (benchmarks/commit_thread.py, 16 synthetic layers), then host_modes.py in PROCS (2) processes with
    # THREADS (eager, the default and 1,1,2 on the calling thread, and by a thread with switch intervals of
    # 20, 100 and 1000 us, 1 by a thread) interleaved, then the decode isolated, VARIANTS (eager,
    # wholefrozen+inplace, the same +ct112) each a process, ROUNDS (2) rounds (about 8 minutes)
    [ -n "${SKIPPLAIN:-}" ] || timeout 120 $PY benchmarks/commit_thread.py 2>&1 | tee "$OUT/commit_thread.txt"
    timeout 300 $PY benchmarks/host_modes.py --processes "${PROCS:-2}" \
      --variants ${THREADS:-eager default 1,1,2 default@t20 default@t100 1,1,2@t20 1,1,2@t100 1,1,2@t1000 1@t100} 2>&1 | tee "$OUT/host_modes_thread.txt"
    VARIANTS=${VARIANTS:-eager,wholefrozen+inplace,wholefrozen+inplace+ct,wholefrozen+inplace+ct112} ROUNDS=${ROUNDS:-2} REPEATS=30 \
      BENCH_LIMIT=${BENCH_LIMIT:-300} bench thread --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A12 "=== isolated" "$OUT/thread.txt"
    ;;
  hostmodes)  # what the slow mode's host waits on, and the commit schedules side by side (fifty-ninth session):
    # benchmarks/host_modes.py, one segment in place, PROCS (8) processes of the default schedule alone (each
    # call's stretches, async_evals, each commit by its place, the main thread's context switches), then PROCSAB (4)
    # processes each running SCHEDULES (eager, default (1,1,2 since the sixtieth session), 2, 1 and 2 in turn, 0) interleaved (about 6 minutes)
    timeout 300 $PY benchmarks/host_modes.py --processes "${PROCS:-8}" --by-place 2>&1 | tee "$OUT/host_modes.txt"
    timeout 400 $PY benchmarks/host_modes.py --processes "${PROCSAB:-4}" \
      --variants ${SCHEDULES:-eager default 2 1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2,1,2 0} 2>&1 | tee "$OUT/host_modes_ab.txt"
    ;;
  tune)  # the commit schedule chosen at run time (SEGC_LIVE_COMMITS=tune, segc.lower.live_tune; sixty-second
    # session): its tests, then host_modes.py interleaving eager, 1,1,2, every second, 3,5,5,3 and tune in PROCSAB (4)
    # processes (the tuner tunes on 80 calls of its own first; its choice printed), then the decode, VARIANTS (eager, wholefrozen+inplace, +lc3553,
    # +lctune) each a process, two rounds, 80 calls of warm-up (about 8 minutes). TUNE=host: the tests and
    # host_modes alone (about 4 minutes), TUNE=iso: the isolated decode alone (about 4 minutes): two device
    # calls, each well inside a call's 600 s, where the whole might not be
    if [ "${TUNE:-all}" != iso ]; then
      timeout 120 $PY -m pytest -q -p no:benchmark -p no:cacheprovider --timeout 100 tests/test_live_tune.py >"$OUT/tune_tests.txt" 2>&1
      echo "tune tests: rc=$?"; tail -2 "$OUT/tune_tests.txt"
      timeout 420 $PY benchmarks/host_modes.py --processes "${PROCSAB:-4}" \
        --variants ${SCHEDULES:-eager default 2 3,5,5,3 tune} 2>&1 | tee "$OUT/host_modes_tune.txt"
    fi
    if [ "${TUNE:-all}" != host ]; then
      VARIANTS=${VARIANTS:-eager,wholefrozen+inplace,wholefrozen+inplace+lc3553,wholefrozen+inplace+lctune} ROUNDS=${ROUNDS:-2} \
        REPEATS=30 WARMUP=80 BENCH_LIMIT=${BENCH_LIMIT:-300} bench tune --prefill 0 --first-call-layers 0 --no-dispatch
      grep -A12 "=== isolated" "$OUT/tune.txt"
    fi
    ;;
  hostsplit)  # where one segment's host time goes (fifty-seventh session): what a commit holding MLX's cuDNN
    # attention costs (benchmarks/commit_sdpa.py, cuDNN's and MLX's own attention); the decode, VARIANTS (eager,
    # frozenhead+inplace, wholefrozen+inplace: the default commits) each a process, two rounds; with LIVEHOST=1
    # wholefrozen in place under cProfile (live_host.py); mlx-lm's own generation loop (bench_generate.py: eager, segc's
    # defaults and segc-best, one process, rounds alternating; PROMPTS (1000) tokens, then 256 greedy tokens)
    for c in 1 0; do
      MLX_CUDA_USE_CUDNN_SDPA=$c timeout 60 $PY benchmarks/commit_sdpa.py >"$OUT/commit_sdpa$c.txt" 2>&1
      echo "commit_sdpa cudnn=$c: rc=$?"; cat "$OUT/commit_sdpa$c.txt"
    done
    VARIANTS=${VARIANTS:-eager,frozenhead+inplace,wholefrozen+inplace} ROUNDS=${ROUNDS:-2} REPEATS=30 \
      BENCH_LIMIT=${BENCH_LIMIT:-260} bench hostsplit --prefill 0 --first-call-layers 0 --no-dispatch
    grep -A8 "=== isolated" "$OUT/hostsplit.txt"
    if [ -n "${LIVEHOST:-}" ]; then
      SEGC_KV_IN_PLACE=1 timeout 60 $PY benchmarks/live_host.py --variant wholefrozen --calls 30 >"$OUT/live_host_whole.txt" 2>&1
      echo "live_host wholefrozen: rc=$?"; head -45 "$OUT/live_host_whole.txt"
    fi
    for p in ${PROMPTS:-1000}; do
      timeout 150 $PY benchmarks/bench_generate.py --layers 16 --hidden 2048 --intermediate 8192 --heads 32 \
        --kv-heads 8 --vocab 32000 --dtype bfloat16 --tokens 256 --prompt $p --rounds 2 \
        --variants eager,segc,segc-best >"$OUT/generate_$p.txt" 2>&1
      echo "generate $p: rc=$?"; tail -20 "$OUT/generate_$p.txt"
    done
    ;;
  pool)  # does the decode step's slow mode follow CUDA's pool handing memory back? (benchmarks/mempool.py): STEPS'
    # kernels (default segc,segcinplace; each call's attention kernels summed, the pool's bytes after each call),
    # with and without --pool-keep, alternating, two processes each (carry .gpu/cupti); then the decode of eager,
    # frozen+inplace and frozen+inplace+poolkeep, each a process, two rounds (about 6 minutes in all; POOLRUNS=1: one
    # process each for the kernels, about 4; POOLDECODE=0: no decode)
    for r in $(seq "${POOLRUNS:-2}"); do
      CALLS=40 NOUVM=1 BYLAYER=${BYLAYER:-kv_attention|78_} STEPS=${STEPS:-segc,segcinplace} bash "$0" timeline &&
        mv "$OUT/timeline.txt" "$OUT/timeline_pool$r.txt"
      POOLKEEP=1 CALLS=40 NOUVM=1 BYLAYER=${BYLAYER:-kv_attention|78_} STEPS=${STEPS:-segc,segcinplace} bash "$0" timeline &&
        mv "$OUT/timeline.txt" "$OUT/timeline_poolkeep$r.txt"
    done
    grep -H "calls; span\|CUDA's pool\|each call's sum" "$OUT"/timeline_pool*.txt | cut -c1-400
    if [ "${POOLDECODE:-1}" = 1 ]; then  # POOLDECODE=0: the kernels alone
      VARIANTS=${VARIANTS:-eager,frozen+inplace,frozen+inplace+poolkeep} ROUNDS=2 REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-240} \
        bench pool --prefill 0 --first-call-layers 0 --no-dispatch
    fi
    ;;
  bank)  # the counters' bank against the tree before it (OLD), and the attention's forms after 96 MB and 2 GB a layer
    S=${STEPS:-segc,segcinplace,segcnokv}
    for r in 1 2; do
      STEPS=$S bash "$0" timeline && mv "$OUT/timeline.txt" "$OUT/timeline_new$r.txt"
      if [ -n "${OLD:-}" ]; then
        PYTHONPATH="$OLD:${PYTHONPATH:-}" STEPS=$S bash "$0" timeline && mv "$OUT/timeline.txt" "$OUT/timeline_old$r.txt"
      fi
    done
    grep -H "calls; span" "$OUT"/timeline_*.txt | cut -c1-170
    timeout 200 $PY benchmarks/kvattn_device.py --repeats 20 --flush 96 >"$OUT/kvattn_flush96.txt" 2>&1
    echo "flush 96 MB: rc=$?"
    timeout 300 $PY benchmarks/kvattn_device.py --repeats 10 --flush 2048 >"$OUT/kvattn_flush2048.txt" 2>&1
    echo "flush 2 GB: rc=$?"
    ;;
  layers)  # the attention kernels of STEPS' steps layer by layer (timeline --by-layer), three processes
    for r in 1 2 3; do
      NOUVM=1 BYLAYER=${BYLAYER:-78_|attention_one} STEPS=${STEPS:-segc,segcinplace,segcnokv} bash "$0" timeline &&
        mv "$OUT/timeline.txt" "$OUT/timeline_layers$r.txt"
      if [ -n "${NOCACHE:-}" ]; then
        CACHELIMIT=0 NOUVM=1 BYLAYER=${BYLAYER:-78_|attention_one} STEPS=${STEPS:-segc,segcinplace,segcnokv} bash "$0" timeline &&
          mv "$OUT/timeline.txt" "$OUT/timeline_nocache$r.txt"
      fi
    done
    grep -H "calls; span\|by layer\|each call's sum" "$OUT"/timeline_layers*.txt "$OUT"/timeline_nocache*.txt 2>/dev/null | cut -c1-300
    ;;
  stamps)  # the write with its attention part by part inside the step, from its blocks' own stamps (and their SMs'
    # clock), three processes; nvidia-smi's clocks, power and throttle reasons every 200 ms beside them ($OUT/clocks.csv);
    # WHERE=1: each call's input addresses and whether each is device, managed or host memory (--where)
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
      --format=csv -lms 200 >"$OUT/clocks.csv" 2>&1 &
    smi=$!
    for r in $(seq "${STAMPRUNS:-3}"); do
      MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000 timeout 200 $PY benchmarks/kvattn_stamps.py \
        --steps "${STEPS:-segc,segcinplace,segcqrope,segcinplaceqrope}" --calls 30 ${WHERE:+--where} >"$OUT/stamps$r.txt" 2>&1
      echo "stamps $r: rc=$?"
    done
    kill "$smi" 2>/dev/null
    grep -H "calls, \| fast \| slow \|  call \|Error\|kinds seen\|distinct" "$OUT"/stamps*.txt | cut -c1-220
    cut -d, -f2,3,6 "$OUT/clocks.csv" | sort | uniq -c | sort -rn | head -12  # how often each clock and reason
    if [ -n "${DECODE:-}" ]; then  # then the decode with the queries rotated first, each variant a process, one round
      VARIANTS=eager,frozen+inplace,frozen+inplace+qrope,frozen,frozen+qrope REPEATS=30 BENCH_LIMIT=240 \
        bench qrope --prefill 0 --first-call-layers 0 --no-dispatch
      grep -A7 "=== isolated" "$OUT/qrope.txt"
    fi
    ;;
  stagedecode)  # the decode with and without it, each variant a process, two rounds (about 5 minutes)
    VARIANTS=eager,frozen,frozen+stage,frozen+inplace+nostage,frozen+inplace ROUNDS=2 REPEATS=30 BENCH_LIMIT=${BENCH_LIMIT:-400} \
      bench stage --prefill 0 --first-call-layers 0 --no-dispatch
    ;;
  kvattndev)  # the write and attention's forms on the device's clock, and the in-place writes of a lowered step
    timeout 150 $PY benchmarks/kvattn_device.py --repeats 30 --step-layers 16 >"$OUT/kvattn_device.txt" 2>&1
    echo "kvattndev: rc=$?"
    ;;
  kvattn)  # the rotated write with its attention as one kernel (the default) or apart (SEGC_FUSED_KV_ATTENTION=0)
    onoff kvattn SEGC_FUSED_KV_ATTENTION 1 0
    ;;
  prefill)  # prefill of 512 tokens: segc's defaults, concatenated, concatenated and frozen
    # MODEL_ARGS (e.g. "--bits 4" or "--arch mixtral") picks another model; its log is prefill_<words>
    # shellcheck disable=SC2086  # the extra arguments are meant to split
    VARIANTS=${VARIANTS:-eager,compile,segc,concat,frozen} REPEATS=20 BENCH_LIMIT=${BENCH_LIMIT:-200} \
      bench "prefill$(echo ${MODEL_ARGS:-} | tr -c 'a-z0-9\n' '_')" --prefill 512 --no-decode --first-call-layers 0 --no-dispatch ${MODEL_ARGS:-}
    ;;
  prefillproducts)  # a prefill's products alone against eager's prefill: the bf16 and 4-bit llama, the mixtral
    for m in "" "--bits 4" "--arch mixtral"; do
      # shellcheck disable=SC2086  # the model's arguments are meant to split
      timeout 100 $PY benchmarks/prefill_products.py $m --repeats 20 >>"$OUT/prefill_products.txt" 2>&1
      echo "prefillproducts ${m:-bf16}: rc=$?"
    done
    ;;
  dequantized)  # the 4-bit prefill's products as their dequantized weights' products, and without
    timeout 280 $PY -m pytest -q -p no:benchmark -p no:cacheprovider tests/test_dequantized_cuda.py tests/test_dequantized.py \
      >"$OUT/dequantized_tests.txt" 2>&1
    echo "dequantized tests: rc=$?"
    timeout 150 $PY benchmarks/prefill_qmm.py --bits 4 --tokens 16,128,512,2048 --repeats 10 --peak 512 >"$OUT/prefill_qmm.txt" 2>&1
    echo "prefill_qmm: rc=$?"
    VARIANTS=eager,compile,segc,frozen REPEATS=20 BENCH_LIMIT=120 \
      bench prefill4_512 --prefill 512 --no-decode --first-call-layers 0 --no-dispatch --bits 4
    (export SEGC_DEQUANTIZED_PRODUCTS=0 && VARIANTS=segc,frozen REPEATS=20 BENCH_LIMIT=70 \
      bench prefill4_512_off --prefill 512 --no-decode --first-call-layers 0 --no-dispatch --bits 4)
    VARIANTS=eager,segc,frozen REPEATS=10 BENCH_LIMIT=120 \
      bench prefill4_2048 --prefill 2048 --no-decode --first-call-layers 0 --no-dispatch --bits 4
    ;;
  experts)  # the mixtral prefill's expert products over every token (segc.lower.experts), and without
    timeout 240 $PY -m pytest -q -p no:benchmark -p no:cacheprovider tests/test_experts_cuda.py tests/test_experts.py \
      >"$OUT/experts_tests.txt" 2>&1
    echo "experts tests: rc=$?"
    timeout 150 $PY benchmarks/prefill_moe.py --tokens 512,2048 --repeats 10 --peak 512 >"$OUT/prefill_moe.txt" 2>&1
    echo "prefill_moe: rc=$?"
    VARIANTS=eager,compile,segc,frozen REPEATS=20 BENCH_LIMIT=150 \
      bench moe_prefill512 --prefill 512 --no-decode --first-call-layers 0 --no-dispatch --arch mixtral
    (export SEGC_DENSE_EXPERTS=0 && VARIANTS=segc,frozen REPEATS=20 BENCH_LIMIT=90 \
      bench moe_prefill512_off --prefill 512 --no-decode --first-call-layers 0 --no-dispatch --arch mixtral)
    VARIANTS=eager,segc,frozen REPEATS=10 BENCH_LIMIT=150 \
      bench moe_prefill2048 --prefill 2048 --no-decode --first-call-layers 0 --no-dispatch --arch mixtral
    VARIANTS=eager,segc,frozen REPEATS=10 BENCH_LIMIT=200 \
      bench moe4_prefill512 --prefill 512 --no-decode --first-call-layers 0 --no-dispatch --arch mixtral --bits 4
    ;;
  experiment)  # issue 15: predicted against measured, every plan (a device call of its own)
    timeout "${BENCH_LIMIT:-575}" $PY benchmarks/bench_experiment.py --model reference --workloads "${WORKLOADS:-decode:1024,prefill:512}" \
      --strategies none,markers,every:2,every:4,balanced:2..18:4,memory:1x..2x:1x,optimal,optimal:1x,optimal:markers,min_boundary_bytes \
      --calibration none,min_boundary_bytes,every:4,balanced:2 --processes "${PROCESSES:-12}" --repeats 10 --warmup 2 \
      --overheads "${OVERHEADS:-group}" ${MACHINE:+--machine "$MACHINE"} ${FIT_FIRST:+--fit-first} \
      --commit "${COMMIT:-auto}" --order "${ORDER:-rounds}" --time-limit "$(( ${BENCH_LIMIT:-575} - 20 ))" --plots "" --out "$OUT/experiment" --json "$OUT/experiment.json" >"$OUT/experiment.txt" 2>&1
    echo "experiment: rc=$?"
    # one file: the device call brings back only a few files (plans and graphs would be left out)
    tar czf "$OUT/experiment.tgz" -C "$OUT" experiment && rm -rf "$OUT/experiment"
    ;;
  paging)  # issue 16: resident, draining and fenced pagers, decode and banded prefill
    timeout "${BENCH_LIMIT:-500}" $PY benchmarks/bench_paging.py --layers 16 --hidden 2048 --intermediate 8192 \
      --heads 32 --kv-heads 8 --vocab 32000 --dtype bfloat16 --prompts 2048,8192 --chunk 2048 --tokens 6 \
      --rounds 2 --weights "${WEIGHTS:-0.25,0.5,0.75}" --kv-context 0 --dir /tmp/segc-paging \
      --out "$OUT/paging.json" --plot "$OUT/paging.svg" >"$OUT/paging.txt" 2>&1
    echo "paging: rc=$?"
    ;;
  plandevice)  # issue 15: each prefill plan's device span, its own (one CUDA graph) and in the pipeline
    all=none,markers,every:2,every:4,balanced:2,balanced:6,balanced:10,balanced:14,balanced:18,memory:1x,memory:2x,optimal,optimal:1x,optimal:markers,min_boundary_bytes
    MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=100000 timeout 200 $PY benchmarks/plan_device.py \
      --workload "${WORKLOAD:-prefill:512}" --strategies $all --commit fences >"$OUT/plan_device_own.txt" 2>&1
    echo "plandevice own: rc=$?"
    timeout 200 $PY benchmarks/plan_device.py --workload "${WORKLOAD:-prefill:512}" --strategies $all --commit segment >"$OUT/plan_device_segment.txt" 2>&1
    echo "plandevice segment: rc=$?"
    ;;
  hostkinds)  # the host per segment, per product kernel and per elementwise kernel: host_kinds.py
    timeout 200 $PY benchmarks/host_kinds.py --repeats 60 --machine-out "$OUT/host_kinds.json" >"$OUT/host_kinds.txt" 2>&1
    echo "hostkinds: rc=$?"
    ;;
  argcost)  # what one more argument costs a compiled, committed segment: arg_cost.py
    timeout 120 $PY benchmarks/arg_cost.py >"$OUT/arg_cost.txt" 2>&1
    echo "argcost: rc=$?"
    ;;
  segment)  # a segment's compiled call, commit and primitives: segment_host.py, three models
    for a in "" "--bits 4" "--arch mixtral"; do
      # shellcheck disable=SC2086  # the extra arguments are meant to split
      timeout 200 $PY benchmarks/segment_host.py --calls 50 --kinds $a >"$OUT/segment_host${a// /_}.txt" 2>&1
      echo "segment $a: rc=$?"
    done
    ;;
  hostcost)  # MLX's host time per kernel: builtin and custom kernels, eager, compiled, 17 commits
    timeout 120 $PY benchmarks/host_cost.py >"$OUT/host_cost.txt" 2>&1
    echo "hostcost: rc=$?"
    ;;
  perf)  # a native profile of the cached decode step (perf carried as .gpu/perfx/perf.tar.xz)
    P=/tmp/perf && mkdir -p $P && tar -C $P -xJf .gpu/perfx/perf.tar.xz
    ORIG_LD="${LD_LIBRARY_PATH:-}"  # the profiled process keeps the machine's own (CUDA's driver)
    PERF="env LD_LIBRARY_PATH=$P/lib${ORIG_LD:+:$ORIG_LD} $P/perf"
    cat /proc/sys/kernel/perf_event_paranoid >"$OUT/perf_env.txt" 2>&1
    $PERF stat -e task-clock true >>"$OUT/perf_env.txt" 2>&1
    for v in ${PERF_VARIANTS:-eager compile frozen frozenhead frozen2}; do
      rm -f /tmp/pctl /tmp/pack && mkfifo /tmp/pctl /tmp/pack
      timeout 150 $PERF record -F ${PERF_F:-2999} ${PERF_G:-} -D -1 --control fifo:/tmp/pctl,/tmp/pack -o /tmp/perf_$v.data \
        env LD_LIBRARY_PATH="$ORIG_LD" $PY -X perf benchmarks/native_profile.py --variant $v --seconds 6 --ctl /tmp/pctl --ack /tmp/pack \
        >"$OUT/perf_$v.txt" 2>&1
      echo "perf $v: rc=$?"
      timeout 90 $PERF report -i /tmp/perf_$v.data --stdio --no-children --sort pid,dso \
        2>/dev/null | sed "s/   */  /g" | cut -c1-240 | head -40 >>"$OUT/perf_$v.txt"
      MAIN=$(grep -o '^pid [0-9]*' "$OUT/perf_$v.txt" | cut -d' ' -f2)  # the main thread alone
      timeout 90 $PERF report -i /tmp/perf_$v.data --stdio --no-children --percentage relative ${MAIN:+--tid $MAIN} --sort dso,sym \
        2>/dev/null | grep -v "^$" | sed "s/   */  /g" | cut -c1-240 | head -800 >>"$OUT/perf_$v.txt"
      if [ -n "${PERF_G:-}" ]; then  # with call graphs: each function's samples with its callees'
        timeout 200 $PERF report -i /tmp/perf_$v.data --stdio --children --percentage relative ${MAIN:+--tid $MAIN} --sort sym -g none \
          --percent-limit 0.5 2>/dev/null | grep -v "^$" | sed "s/   */  /g" | cut -c1-240 | head -200 >"$OUT/perf_${v}_children.txt"
      fi
    done
    ;;
  runtime)
    timeout 300 $PY benchmarks/bench_runtime.py --layers 16 --hidden 2048 --intermediate 8192 --heads 32 \
      --kv-heads 8 --vocab 32000 --dtype bfloat16 --context 1024 --tokens 30 --only decode >"$OUT/runtime.txt" 2>&1
    echo "runtime: rc=$?"
    ;;
  *) echo "unknown part $p" ;;
  esac
done
