#!/usr/bin/env bash
# comms_logger through train on 2 ranks: the summary at the end in DeepSpeed's log_summary()
# layout, with the gradient buckets' counts (steps x buckets) and sizes, busbw = algbw x
# 2(n-1)/n for all_reduce and (n-1)/n for reduce_scatter / all_gather; verbose lines on rank 0
# only; debug's caller names; prof_ops keeping only the named collectives; off: nothing;
# an unknown prof_ops name refused naming the key.
source "$(dirname "$0")/lib.sh"

# The tiny model has 21472 parameters: buckets of 6000 elements are 3 x 23.44 KB + 13.56 KB
# (3472 elements) of fp32 gradients.
write_config ar.json "$CONFIGS/default.json" '
c["zero_optimization"] = {"stage": 0, "reduce_bucket_size": 6000}
c["comms_logger"] = {"enabled": True, "verbose": True, "debug": True}'
must_run 2 ar --config ar.json "${TINY[@]}" --steps 3

# ZeRO-2: each bucket reduced to the ranks holding it (reduce_scatter); the updated halves
# gathered in allgather_bucket_size / 2 = 4000 elements per rank: 2 x 31.25 KB + 21.38 KB.
write_config rs.json "$CONFIGS/default.json" '
c["zero_optimization"] = {"stage": 2, "reduce_bucket_size": 6000, "allgather_bucket_size": 8000}
c["comms_logger"] = {"enabled": True, "prof_all": False, "prof_ops": ["reduce_scatter", "all_gather_into_tensor"]}'
must_run 2 rs --config rs.json "${TINY[@]}" --steps 3

"$PY" - ar.out rs.out <<'PYEOF'
import re, sys

HEADER = ("Comm. Op            Message Size        Count               Total Latency(ms)   "
          "Avg Latency(ms)     algbw_avg (Gbps)    busbw_avg (Gbps)")

def summary(path):
    lines = open(path).read().splitlines()
    i = lines.index("[train] comms_logger summary (rank 0):")
    assert lines[i + 1] == HEADER, lines[i + 1]
    table, name = {}, None
    for line in lines[i + 2:]:
        if not line.startswith(" "):
            name = line
            table[name] = {}
            continue
        size, count, total, avg, alg, bus = re.split(r"\s{2,}", line.strip())
        table[name][size] = (int(count), float(total), float(avg), float(alg), float(bus))
    return table

def check_bus(rows, factor, what):
    for size, (_, _, _, alg, bus) in rows.items():
        assert abs(bus - alg * factor) <= 0.011, (what, size, alg, bus)

steps = 3
ar = summary(sys.argv[1])
grads = ar["all_reduce | [Caller Func: backward]"]
assert {s: r[0] for s, r in grads.items()} == {"23.44 KB": 3 * steps, "13.56 KB": steps}, grads
check_bus(grads, 1.0, "all_reduce")  # 2(n-1)/n = 1 at 2 ranks
assert ar["broadcast | [Caller Func: initialize]"]["83.88 KB"][0] == 1, ar  # the initial parameters
assert ar["all_reduce | [Caller Func: step]"]["32.0 B"][0] == steps, ar     # the step's checks

verbose = [l for l in open(sys.argv[1]).read().splitlines() if "comm op: " in l]
bucket_lines = [l for l in verbose if "comm op: all_reduce | [Caller Func: backward] |" in l]
assert len(bucket_lines) == 4 * steps, len(bucket_lines)
pat = re.compile(r"^\[rank 0\] comm op: .+ \| time \(ms\): \d+\.\d\d \| msg size: [\d.]+ K?B \| "
                 r"algbw \(Gbps\): \d+\.\d\d \| busbw \(Gbps\): \d+\.\d\d$")
bad = [l for l in verbose if not pat.match(l)]
assert not bad, bad  # every line from rank 0, in DeepSpeed's format

rs = summary(sys.argv[2])
assert set(rs) == {"reduce_scatter", "all_gather"}, set(rs)  # prof_ops: nothing else recorded
assert {s: r[0] for s, r in rs["reduce_scatter"].items()} == {"23.44 KB": 3 * steps, "13.56 KB": steps}, rs
assert {s: r[0] for s, r in rs["all_gather"].items()} == {"31.25 KB": 2 * steps, "21.38 KB": steps}, rs
check_bus(rs["reduce_scatter"], 0.5, "reduce_scatter")  # (n-1)/n
check_bus(rs["all_gather"], 0.5, "all_gather")
print("comms_logger: %d bucket all_reduces, %d reduce_scatters, %d all_gathers, %d verbose lines" %
      (sum(r[0] for r in grads.values()), sum(r[0] for r in rs["reduce_scatter"].values()),
       sum(r[0] for r in rs["all_gather"].values()), len(verbose)))
PYEOF
[ $? = 0 ] || fail "the comms_logger summary does not match"
grep -q "comm op:" rs.out && fail "verbose lines without verbose"

# Off (the default): no summary, no lines.
must_run 2 off --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2
grep -q "comms_logger\|comm op:" off.out && fail "comms_logger output while it is off"

write_config bad.json "$CONFIGS/default.json" 'c["comms_logger"] = {"enabled": True, "prof_ops": ["allreduce"]}'
run_train 2 bad --config bad.json "${TINY[@]}" --steps 2 && fail "an unknown prof_ops name was accepted"
grep -q 'bad.json: comms_logger.prof_ops: unknown collective "allreduce"; expected all_reduce, reduce_scatter, all_gather, broadcast or barrier' bad.err ||
  fail "no error naming comms_logger.prof_ops: $(tail -n 3 bad.err)"
echo "PASS"
