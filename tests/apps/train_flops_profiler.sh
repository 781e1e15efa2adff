#!/usr/bin/env bash
# flops_profiler through train: the profile printed once, by rank 0, at the end of the step
# after profile_step steps; its forward MACs equal the GPT's analytic count; module names,
# module_depth, top_modules, detailed and output_file as configured; the Llama's and the
# MLP's trees.
source "$(dirname "$0")/lib.sh"

TINY_GPT=(--n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 0 --sample_tokens 0)
write_config all.json "$CONFIGS/default.json" '
c["train_micro_batch_size_per_gpu"] = 2
c["gradient_accumulation_steps"] = 2
c.pop("steps_per_print")  # the train app then prints a line per step
c["flops_profiler"] = {"enabled": True, "profile_step": 1, "top_modules": 2}'

# 2 ranks, stdout: one profile, after step 1's line and before step 2's.
must_run 2 two --config all.json "${TINY_GPT[@]}" --steps 3
[ "$(grep -c '^Profile Summary at step 1:$' two.out)" = 1 ] || fail "expected one profile: $(grep -c Profile two.out)"
awk '/step=1\/3/ {a=NR} /DeepSpeed Flops Profiler/ {p=NR} /step=2\/3/ {b=NR} END {exit !(a && a < p && p < b)}' two.out ||
  fail "the profile is not printed at the end of step 2 (profile_step 1)"
grep -Eq '^world size: +2$' two.out && grep -Eq '^data parallel size: +2$' two.out &&
  grep -Eq '^batch size per GPU: +2$' two.out || fail "summary sizes: $(grep -E 'size' two.out)"
# The forward MACs of one micro-batch of B=2 x T=16 tokens: B*T*(12*L*C^2 + V*C) + 2*B*T^2*C*L
# (C 32, L 2, V 256), printed as DeepSpeed's macs_to_string; flops twice that.
"$PY" - two.out <<'PYEOF' || fail "the forward MACs or FLOPs differ from the analytic count"
import re, sys
text = open(sys.argv[1]).read()
B, T, C, L, V = 2, 16, 32, 2, 256
macs = B * T * (12 * L * C * C + V * C) + 2 * B * T * T * C * L
def ds(v):  # DeepSpeed's number_to_string
    for m, u in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if v >= m:
            return f"{round(v / m, 2):g} {u}"
    return f"{v:g} "
assert re.search(r"^fwd MACs per GPU: +%sMACs$" % re.escape(ds(macs)), text, re.M), ds(macs)
assert re.search(r"^fwd flops per GPU: +%s$" % re.escape(ds(2 * macs).rstrip()), text, re.M), ds(2 * macs)
assert re.search(r"^Gpt\(\n  [0-9.]+ K = 100%% Params, %sMACs = 100%% MACs" % re.escape(ds(macs)), text, re.M)
for line in ("samples/second: ", "iter latency: ", "bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: "):
    assert re.search("^" + re.escape(line) + r" +[0-9.]+( |$)", text, re.M), line
print("fwd MACs %d = %sMACs" % (macs, ds(macs)))
PYEOF
for m in '(h): ModuleList(' '(0): Block(' '(1): Block(' '(attn): Attention(' '(c_attn): Linear(' '(mlp): Mlp(' \
         '(ln_f): LayerNorm(' '(lm_head): Linear(' 'depth 4:'; do
  grep -qF "$m" two.out || fail "no '$m' in the profile"
done
grep -Eq "^    params      - \{'ModuleList': '[0-9.]+ K', 'Embedding': '[0-9.]+ K'\}$" two.out ||
  fail "top_modules 2 at depth 1: $(grep -A1 '^depth 1:' two.out)"

# module_depth 2, not detailed, into output_file (its directory created): the file has the
# profile down to depth 2, stdout none.
write_config shallow.json all.json '
c["flops_profiler"].update({"module_depth": 2, "detailed": False, "output_file": "prof/run/profile.txt"})'
must_run 2 file --config shallow.json "${TINY_GPT[@]}" --steps 2
grep -q 'Flops Profiler' file.out && fail "the profile went to stdout with output_file set"
[ -s prof/run/profile.txt ] || fail "no prof/run/profile.txt"
[ "$(grep -c '^Profile Summary at step 1:$' prof/run/profile.txt)" = 1 ] || fail "the file does not hold one profile"
grep -q '^depth 2:$' prof/run/profile.txt && ! grep -q '^depth 3:$' prof/run/profile.txt ||
  fail "module_depth 2: $(grep '^depth' prof/run/profile.txt)"
grep -q 'Detailed Profile' prof/run/profile.txt && fail "detailed false printed the tree"

# module_depth 2 with the tree: blocks are leaves.
write_config tree2.json all.json 'c["flops_profiler"].update({"module_depth": 2})'
must_run 1 tree2 --config tree2.json "${TINY_GPT[@]}" --steps 2
grep -Eq '^    \(0\): Block\([0-9.]+ K = [0-9.]+% Params' tree2.out || fail "block 0 is not a leaf at module_depth 2"
grep -qF '(c_attn)' tree2.out && fail "module_depth 2 printed depth 4"

# profile_step 0 on the Llama and the MLP: their trees.
write_config first.json all.json 'c["flops_profiler"].update({"profile_step": 0})'
must_run 1 llama --config first.json --model llama --n_layer 1 --n_head 4 --n_kv_head 2 --n_embd 32 --block_size 16 \
  --eval_iters 0 --sample_tokens 0 --steps 1
for m in 'LlamaForCausalLM(' '(self_attn): LlamaAttention(' '(k_proj): Linear(' '(lm_head): Linear('; do
  grep -qF "$m" llama.out || fail "no '$m' in the Llama's profile"
done
must_run 1 mlp --config first.json --model mlp --n_layer 2 --n_embd 32 --block_size 8 --eval_iters 0 --steps 1
grep -qF '(fc): ModuleList(' mlp.out && grep -qF '(head): Linear(' mlp.out || fail "the MLP's tree: $(grep -A8 '^Mlp(' mlp.out)"
echo "PASS"
