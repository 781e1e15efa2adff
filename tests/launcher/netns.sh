#!/usr/bin/env bash
# Two-host dsrun job over two network namespaces joined by a veth pair (private test subnet,
# addresses only on the veth ends). mpirun runs in namespace A; Open MPI's remote agent
# (scripts/netns-agent.sh, in place of ssh) starts orted in namespace B; ranks talk over TCP
# on the veth link. Exercises hostfile -> dsrun -> mpirun --host -> remote launch -> TCP BTL.
# Exit 77 (skip) when network namespaces cannot be created here.
set -euo pipefail
SRC=${DS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DSRUN=${DSRUN:-$DS_BINARY_DIR/apps/dsrun/dsrun}
HELLO=${HELLO:-$DS_BINARY_DIR/tests/launcher/ds_launch_hello}
command -v ip >/dev/null || { echo "SKIP: iproute2 (ip) not installed"; exit 77; }
id=$(( $$ % 200 + 20 ))
A=dsA$$ B=dsB$$ NET=10.99.$id ADDR_A=10.99.$id.1 ADDR_B=10.99.$id.2
T=$(mktemp -d /tmp/dsrun_netns.XXXXXX)
cleanup() { bash "$SRC/scripts/netns-down.sh" "$A" "$B"; rm -rf "$T"; }
trap cleanup EXIT
if ! ip netns add "$A.probe" 2>"$T/err"; then
  echo "SKIP: cannot create network namespaces here: $(cat "$T/err")"
  exit 77
fi
ip netns delete "$A.probe"
bash "$SRC/scripts/netns-up.sh" "$A" "$B" "$ADDR_A" "$ADDR_B" 24

# Namespace ids as grep patterns ("net:[4026532245]" with the brackets escaped).
ns_a=$(ip netns exec "$A" readlink /proc/self/ns/net | sed 's/[][]/\\&/g')
ns_b=$(ip netns exec "$B" readlink /proc/self/ns/net | sed 's/[][]/\\&/g')
[ "$ns_a" != "$ns_b" ] || { echo "FAIL: namespaces not distinct"; exit 1; }
printf '# two namespace hosts\n%s slots=2\n%s slots=2\n' "$ADDR_A" "$ADDR_B" > "$T/hostfile"

# The agent maps host -> namespace; TCP between hosts only on the test subnet. Each side runs
# in its own UTS namespace named after its network namespace (distinct host names, as on real
# machines; Open MPI names session directories and shared-memory segments after the host).
run() {
  ip netns exec "$A" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$A" \
    env DS_NETNS_HOSTS="$ADDR_A=$A $ADDR_B=$B" OMPI_MCA_plm_rsh_agent="$SRC/scripts/netns-agent.sh" \
    OMPI_MCA_btl_tcp_if_include=$NET.0/24 OMPI_MCA_oob_tcp_if_include=$NET.0/24 \
    "$DSRUN" --hostfile "$T/hostfile" "$@"
}
status=0
run "$HELLO" multi host > "$T/out" 2>&1 || { cat "$T/out"; echo "FAIL: 2-host job rc $?"; exit 1; }
cat "$T/out"
for r in 0 1 2 3; do
  node=$((r / 2)) local=$((r % 2)) ns=$ns_a
  [ $node = 1 ] && ns=$ns_b
  host=$A
  [ $node = 1 ] && host=$B
  grep -q "^hello rank=$r size=4 sum=10 expect=10 host=$host .* RANK=$r LOCAL_RANK=$local WORLD_SIZE=4 LOCAL_SIZE=2 CROSS_RANK=$node CROSS_SIZE=2 MASTER_ADDR=$ADDR_A MASTER_PORT=29500 CUDA_VISIBLE_DEVICES=0,1 netns=$ns args=--local_rank=$local|multi|host$" "$T/out" \
    || { echo "FAIL: rank $r line (want namespace $ns)"; status=1; }
done
# Include across hosts: one slot on each -> 2 ranks, one per namespace, uneven slot ids.
run -i "$ADDR_A:1@$ADDR_B:0" "$HELLO" > "$T/out2" 2>&1 || { cat "$T/out2"; echo "FAIL: include job"; exit 1; }
cat "$T/out2"
grep -q "^hello rank=0 size=2 .* CROSS_RANK=0 CROSS_SIZE=2 .*CUDA_VISIBLE_DEVICES=1 netns=$ns_a " "$T/out2" || { echo "FAIL: include rank 0"; status=1; }
grep -q "^hello rank=1 size=2 .* CROSS_RANK=1 CROSS_SIZE=2 .*CUDA_VISIBLE_DEVICES=0 netns=$ns_b " "$T/out2" || { echo "FAIL: include rank 1"; status=1; }
# A rank failing on the remote host stops the job with its exit code.
rc=0
DS_HELLO_FAIL_RANK=3 DS_HELLO_FAIL_CODE=5 run "$HELLO" > "$T/out3" 2>&1 || rc=$?
[ "$rc" = 5 ] || { cat "$T/out3"; echo "FAIL: remote failure rc $rc, want 5"; status=1; }
# The real train app across the two hosts, when it is built (4 ranks, 2 steps, small model).
TRAIN=$DS_BINARY_DIR/apps/train/train
if [ -x "$TRAIN" ]; then
  run "$TRAIN" --config "$SRC/configs/default.json" --steps 2 --eval_iters 0 --n_layer 1 \
    --sample_tokens 0 > "$T/out4" 2>&1 || { cat "$T/out4"; echo "FAIL: train across hosts"; status=1; }
  grep -q "world size 4" "$T/out4" && grep -q "done: 2 steps" "$T/out4" \
    || { cat "$T/out4"; echo "FAIL: train output"; status=1; }
  grep -E "world size|done:" "$T/out4"
fi
[ $status = 0 ] && echo "PASS netns 2-host"
exit $status
