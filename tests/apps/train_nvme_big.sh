#!/usr/bin/env bash
# NVMe offload trains a model whose states do not fit the memory the job is given: the
# 430M-parameter GPT of train_zero3_big.sh (34 blocks of width 1024, bf16, AdamW) at stage 3
# on 4 ranks with offload_optimizer and offload_param on "nvme". Its model states are 18 bytes
# per parameter -- 7.2 GiB -- and the job runs in a memory cgroup limited to 4.5 GiB (cgroup v1
# or v2, where this machine lets the test make one; otherwise without a limit, and the sum of
# the ranks' peak resident memory must stay below the states instead). Three steps: finite
# losses that fall; the job's peak memory (the cgroup's, or the ranks' peaks) is printed
# against the states' size. Needs about 6 GiB free for the swap files (skips, 77, otherwise).
source "$(dirname "$0")/lib.sh"

N=4
LIMIT=$((9 << 29))  # 4.5 GiB
free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
if [ "$free_kb" -lt $((8 << 20)) ]; then
  echo "SKIP: $(pwd) has $((free_kb >> 20)) GiB free; the swap files need about 6 GiB"
  exit 77
fi
mkdir nvme
write_config big.json "$CONFIGS/zero3_nvme.json" "
c['train_micro_batch_size_per_gpu'] = 1
c['optimizer']['params']['lr'] = 3e-4
c['scheduler'] = {'type': 'WarmupLR', 'params': {'warmup_num_steps': 1, 'warmup_max_lr': 3e-4}}
c['steps_per_print'] = 1
z = c['zero_optimization']
z['stage3_max_reuse_distance'] = 0          # release every group after use
z['stage3_max_live_parameters'] = 40000000  # about three blocks gathered at most
z['stage3_prefetch_bucket_size'] = 13000000 # one block ahead
z['sub_group_size'] = 1048576               # 4 MiB reads and writes, small buffers
z['offload_optimizer']['nvme_path'] = z['offload_param']['nvme_path'] = '$WORK/nvme'
"
ARGS=(--config big.json --n_layer 34 --n_head 16 --n_embd 1024 --block_size 32 --eval_iters 0 --sample_tokens 0
      --steps 3 --loss_csv loss.csv)

# A memory cgroup for the job, where one can be made.
cg="" usage_file=""
v1=/sys/fs/cgroup/memory
own_v2=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup 2>/dev/null)
if [ -w "$v1" ] && mkdir "$v1/dstrain_nvme_$$" 2>/dev/null; then
  cg=$v1/dstrain_nvme_$$
  echo $LIMIT >"$cg/memory.limit_in_bytes" && usage_file=$cg/memory.max_usage_in_bytes || { rmdir "$cg"; cg=""; }
elif [ -f "$own_v2/cgroup.subtree_control" ] && grep -qw memory "$own_v2/cgroup.subtree_control" 2>/dev/null &&
     mkdir "$own_v2/dstrain_nvme_$$" 2>/dev/null; then
  cg=$own_v2/dstrain_nvme_$$
  echo $LIMIT >"$cg/memory.max" && usage_file=$cg/memory.peak || { rmdir "$cg"; cg=""; }
  [ -f "$usage_file" ] || usage_file=""
fi
cleanup_cg() { [ -n "$cg" ] && rmdir "$cg" 2>/dev/null; return 0; }
trap 'cleanup_cg; rm -rf "$WORK"' EXIT

rc=0
if [ -n "$cg" ]; then
  echo "job limited to $((LIMIT >> 20)) MiB by the memory cgroup $cg"
  bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" \
    "$MPIEXEC" --oversubscribe --bind-to none -np $N "$TRAIN" "${ARGS[@]}" >big.out 2>big.err || rc=$?
else
  echo "no memory cgroup can be made here: the job runs without a limit"
  "$MPIEXEC" --oversubscribe --bind-to none -np $N "$TRAIN" "${ARGS[@]}" >big.out 2>big.err || rc=$?
fi
usage=0
[ -n "$usage_file" ] && usage=$(cat "$usage_file")
if [ $rc != 0 ]; then
  tail -n 20 big.out; tail -n 20 big.err
  fail "train exited $rc$([ -n "$cg" ] && echo " (the cgroup's peak: $((usage >> 20)) MiB of $((LIMIT >> 20)) MiB)")"
fi
grep -E '^\[train\] (model|memory|done)|model states per rank' big.out
"$PY" - loss.csv big.out "$usage" "$([ -n "$cg" ] && echo $LIMIT || echo 0)" $N <<'PYEOF'
import csv, math, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
loss = [float(r["loss"]) for r in rows]
assert len(loss) == 3 and all(math.isfinite(x) for x in loss), loss
assert loss[-1] < loss[0], f"loss did not fall: {loss}"
out = open(sys.argv[2]).read()
usage, limit, N = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
P = int(re.search(r"model: .*\((\d+) parameters\)", out).group(1))
states = 18 * P                             # bf16 params, fp32 grads, master, Adam moments
m = re.search(r"memory per rank: model states ([\d.]+) MiB \(ZeRO stage 3\), peak resident ([\d.]+) MiB", out)
resident, peak = float(m.group(1)) * 2**20, float(m.group(2)) * 2**20
on_nvme = float(re.search(r"\(\+ ([\d.]+) MiB on NVMe\)", out).group(1)) * 2**20
G = 2**30
print(f"losses {loss}; {P} parameters, model states {states / G:.2f} GiB in all; per rank {resident / G:.2f} GiB "
      f"in memory + {on_nvme / G:.2f} GiB on NVMe; peak resident {peak / G:.2f} GiB (largest rank)")
if limit:
    assert states > limit, (states, limit)
    print(f"the job's peak memory (cgroup) {usage / G:.2f} GiB under its limit {limit / G:.2f} GiB; "
          f"the states are {states / limit:.2f}x the limit")
else:
    assert peak * N < states, (peak, N, states)
    print(f"no limit: the ranks' peaks sum to at most {peak * N / G:.2f} GiB, {states / (peak * N):.2f}x below the states")
PYEOF
echo PASS
