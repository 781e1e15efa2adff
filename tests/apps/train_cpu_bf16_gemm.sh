#!/usr/bin/env bash
# kernels.cpu_bf16_gemm on the CPU GPT with bf16 parameters: "off" and "on" are obeyed, "auto"
# says what it measured; the ranks agree on one choice (they must compute the same numbers).
source "$(dirname "$0")/lib.sh"

run_mode() {
  local mode=$1
  write_config "$mode.json" "$CONFIGS/bf16.json" "c['kernels'] = {'cpu_bf16_gemm': '$mode'}"
  must_run 2 "$mode" --config "$mode.json" "${TINY[@]}" --steps 2
  grep -m1 '\[train\] bf16: Linear GEMMs' "$mode.out" || fail "$mode: no bf16 GEMM line"
}

run_mode off
grep -q 'Linear GEMMs in fp32 on bf16 parameters (kernels.cpu_bf16_gemm off)' off.out || fail "off: not fp32"

run_mode auto
grep -Eq 'Linear GEMMs in (bf16|fp32).*\(kernels.cpu_bf16_gemm auto: (bf16 kernel [0-9.]+x the fp32 one on rank 0, bf16 needs 1.25x|this CPU has no AVX512-BF16)' auto.out ||
  fail "auto: the line does not give the measurement"

run_mode on
if grep -qw avx512_bf16 /proc/cpuinfo; then
  grep -q 'Linear GEMMs in bf16 (vdpbf16ps, fp32 accumulation) (kernels.cpu_bf16_gemm on)' on.out || fail "on: not bf16"
else
  grep -q 'Linear GEMMs in fp32 on bf16 parameters (kernels.cpu_bf16_gemm on)' on.out || fail "on: bf16 without AVX512-BF16"
fi
echo "ok: kernels.cpu_bf16_gemm off / auto / on"
