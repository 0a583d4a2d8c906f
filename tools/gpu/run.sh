#!/bin/bash
# On a lent GPU machine, from the repo root, with .gpu/ carried (tools/gpu/pack.sh made it):
# build llama.cpp (CUDA, sm_90, no FlashAttention kernels: 2.5-3.5 min on 16 cores) from
# the vendored sources, make the zero-weight models, then TASK=bench (default): `edgespec
# bench --parallel 4` on the pair (PAIR_ONLY=1: only) and on a 7B-shaped target, DRAFTERS
# (default none auto model); TASK=prof: engine_profile.py; TASK=cache: cache_probe.py on
# both targets (TARGETS; SIZES: prompt tokens, default 2000 8000). EDGESPEC_SRC: the folder
# edgespec is imported from (default: this tree).
# LIBDIR=... skips the build (a dry run elsewhere with a CPU build).
set -u
export PYTHONUNBUFFERED=1
G=$PWD/.gpu; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
t0=$(date +%s); log() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -m1 "Model name"; nproc
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $G/diskcache-*.whl || exit 1
mkdir -p /tmp/m && tar -xJf $G/z.tar.xz -C /tmp/m || exit 1
python3 - <<'PY' || exit 1
import json, os
for n, size in json.load(open("/tmp/m/sizes.json")).items():
    os.rename(f"/tmp/m/{n}.head", f"/tmp/m/{n}.gguf"); os.truncate(f"/tmp/m/{n}.gguf", size)
PY
ls -la /tmp/m
if [ -z "${LIBDIR:-}" ] && [ -f $G/lib.tar.xz ]; then
  mkdir -p /tmp/lib && tar -xJf $G/lib.tar.xz -C /tmp/lib && LIBDIR=/tmp/lib
fi
if [ -z "${LIBDIR:-}" ]; then
  log build; export PATH=/usr/local/cuda/bin:$PATH
  mkdir -p /tmp/src && tar -xJf $G/src.tar.xz -C /tmp/src || exit 1
  cmake -S /tmp/src -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=ON -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF > $OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
  cmake --build /tmp/b -j 16 --target llama > $OUT/build.log 2>&1 || { grep -m5 -A5 error $OUT/build.log; exit 1; }
  LIBDIR=/tmp/b/bin
  (cd $LIBDIR && tar -cf - *.so* | xz -1 -T16 > $OUT/lib.tar.xz); ls -la $OUT/lib.tar.xz
  log built; ls $LIBDIR
fi
export LLAMA_CPP_LIB_PATH=$LIBDIR LD_LIBRARY_PATH=$LIBDIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/site:$G/py:${EDGESPEC_SRC:-$PWD} EDGESPEC_HOME=/tmp/eh
python3 -c "import llama_cpp; print('gpu offload:', llama_cpp.llama_supports_gpu_offload())" || exit 1
if [ "${TASK:-bench}" = prof ]; then
  n=${TOKENS:-96}
  for mode in "auto $n 0" "auto $n 1" "none $n 1" "copy $n 1"; do
    log "prof $mode"; python3 $G/engine_profile.py $mode /tmp/m/qwen2.5-coder-1.5b.gguf \
      /tmp/m/qwen2.5-coder-0.5b.gguf > $OUT/prof-${mode// /-}.txt 2>&1; grep -m1 " s, " $OUT/prof-${mode// /-}.txt
  done
  log done; exit 0
fi
if [ "${TASK:-bench}" = cache ]; then
  for t in ${TARGETS:-qwen2.5-coder-1.5b qwen7b-shaped}; do
    log "cache $t"; python3 $G/cache_probe.py /tmp/m/$t.gguf /tmp/m/qwen2.5-coder-0.5b.gguf \
      ${SIZES:-2000 8000} > $OUT/cache-$t.txt 2>&1; grep "N=\|Error" $OUT/cache-$t.txt
  done
  log done; exit 0
fi
bench() {  # label target extra-args...
  local label=$1 target=$2; shift 2
  log "bench $label"
  python3 -m edgespec bench --parallel 4 --target /tmp/m/$target.gguf \
    --draft /tmp/m/qwen2.5-coder-0.5b.gguf --json $OUT/$label.json "$@" > $OUT/$label.log 2>&1
  echo "rc=$?"; grep -v "measuring\|^\s*$" $OUT/$label.log | tail -14
}
drafters=${DRAFTERS:-none auto model}
bench p15 qwen2.5-coder-1.5b --parallel-drafters $drafters --repeats ${REPEATS:-3} ${EXTRA:-}
[ -n "${PAIR_ONLY:-}" ] || bench p7 qwen7b-shaped --parallel-drafters $drafters --repeats ${REPEATS:-3} ${EXTRA:-}
tar -cf $OUT/costs.tar -C /tmp/eh costs 2>/dev/null
log done
