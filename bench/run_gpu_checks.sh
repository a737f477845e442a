#!/usr/bin/env bash
# The GPU checks of dpsharp in one go, on a machine with one CUDA device and a CUDA build of
# torch (run from the repository root): build the extension with its CUDA kernels, run the
# CUDA tests and the test files whose clipping paths change on a GPU (GPU_TESTS), then the GPU
# benchmark in float32 and under bf16 autocast, then the step profile
# (bench/profile_gpu_step.py). SKIP_BENCH=1 leaves the benchmark out, SKIP_PROFILE=1 the
# profile; BENCH_ARGS and PROFILE_ARGS pass options to the two scripts; NOISE_VARIANTS=1 adds
# bench/noise_kernel_variants.cu, and NCU=1 a hardware-counter report of its production kernel
# (Nsight Compute, clocks left as they are). BASELINE=DIR builds another commit's source tree
# beside this one and times both alternately (see the end of this file). Everything is written
# to the folder given as the first argument (default ./gpu-results).
set -uo pipefail
mkdir -p "${1:-gpu-results}"
out="$(cd "${1:-gpu-results}" && pwd)"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-16}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c \
  "import torch; print('torch', torch.__version__, torch.version.cuda)"; } 2>&1 | tee "$out/device.txt"

start=$SECONDS
cuda_build=(-Ccmake.define.DPSHARP_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90)
python3 -m pip install --no-build-isolation --no-deps -q "${cuda_build[@]}" . \
  >"$out/build.log" 2>&1 || { echo "build failed"; tail -40 "$out/build.log"; exit 1; }
echo "build: $((SECONDS - start)) s"
python3 -c "import dpsharp._core as c; print(c.build_info())" | tee -a "$out/device.txt"

# The installed package, not the source tree: run pytest from outside python/.
GPU_TESTS="${GPU_TESTS:-tests/test_cuda_kernels.py tests/test_soundness_clipping_roundoff.py \
tests/test_torch_device_paths.py tests/test_torch_bfloat16_materialised.py \
tests/test_torch_mixed_precision.py tests/test_stubs.py}"
# shellcheck disable=SC2086
timeout 300 python3 -m pytest $GPU_TESTS -q -p no:cacheprovider -rs \
  2>&1 | tee "$out/cuda_tests.txt"

cd bench
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 bench_gpu.py ${BENCH_ARGS:-} --out "$out/gpu_fp32.md" \
    2>&1 | tail -5
  timeout "${BENCH_TIMEOUT:-240}" python3 bench_gpu.py ${BENCH_ARGS:-} --amp bf16 --out "$out/gpu_bf16.md" 2>&1 \
    | tail -5
fi
# Where a DP step's time goes, and candidate stages timed against the library's own.
[ "${SKIP_PROFILE:-0}" = 1 ] || timeout "${PROFILE_TIMEOUT:-200}" python3 profile_gpu_step.py \
  ${PROFILE_ARGS:-} --out "$out/profile.txt" 2>&1 \
  | grep -v -e '^USDT' -e 'ActivityProfiler' | tail -12
cd ..

# Where the noise pass spends its time (production kernel against its parts); optional.
if [ "${NOISE_VARIANTS:-0}" = 1 ]; then
  nvcc -std=c++17 -O3 -arch=sm_90 -fmad=false -Icpp/include bench/noise_kernel_variants.cu \
    -o /tmp/noise_variants && /tmp/noise_variants 2>&1 | tee "$out/noise_variants.txt"
  if [ "${NCU:-0}" = 1 ]; then
    timeout 120 ncu --clock-control none -k regex:noise_pass --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
      --section WarpStateStats --section Occupancy /tmp/noise_variants >"$out/ncu_noise.txt" 2>&1
    grep -E "Throughput|Pipe|Issue|Occupancy|Duration|Stall|Executed Ipc" "$out/ncu_noise.txt" \
      | head -30
  fi
fi

# A/B against another commit on the same machine: a GPU step's throughput moves by 10-20%
# between runs (it is bound by the host), so a change is only measured against a baseline
# timed alternately in the same call. BASELINE is a folder inside the repository holding the
# other commit's sources, made on the development machine with
#   git archive REV pyproject.toml CMakeLists.txt cpp python README.md LICENSE | tar -x -C DIR
# (DIR ignored by git and named in the device call's carry). AB_ARGS are bench_gpu.py's
# options for both (default: GPT-2 small under bf16; several sets separated by ';', each
# alternated in turn), AB_ROUNDS the alternations; each run is its own process, the baseline's
# package first on PYTHONPATH.
if [ -n "${BASELINE:-}" ]; then
  (cd "$BASELINE" && python3 -m pip install --no-build-isolation --no-deps -q "${cuda_build[@]}" \
    --target /tmp/dpsharp-baseline .) >"$out/baseline_build.log" 2>&1 \
    || { echo "baseline build failed"; tail -40 "$out/baseline_build.log"; exit 1; }
  cd bench
  IFS=';' read -ra ab_sets <<< "${AB_ARGS:---models gpt2s --amp bf16 --rounds 2}"
  for ab_args in "${ab_sets[@]}"; do
    for _ in $(seq "${AB_ROUNDS:-2}"); do
      for version in this baseline; do
        path="${PYTHONPATH:-}"
        [ "$version" = baseline ] && path="/tmp/dpsharp-baseline${path:+:$path}"
        # shellcheck disable=SC2086
        row=$(PYTHONPATH="$path" timeout 120 python3 bench_gpu.py $ab_args --numel 1048576 \
          2>/dev/null | grep -E '^\| [a-z0-9]+ \| [0-9]' | awk '!seen[$0]++')
        echo "$version ($ab_args): $row" | tee -a "$out/ab.txt"
      done
    done
  done
  cd ..
fi
