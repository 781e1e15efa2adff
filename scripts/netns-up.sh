#!/usr/bin/env bash
# Two network namespaces joined by a veth pair, as two "hosts" for multi-node launcher tests.
# Usage: netns-up.sh NAME_A NAME_B ADDR_A ADDR_B PREFIXLEN
#   e.g. netns-up.sh dsA dsB 10.99.7.1 10.99.7.2 24
# Private test addresses only, and only on the veth ends inside the namespaces: nothing is
# added to the root namespace, so traffic stays on the test interfaces. Undo: netns-down.sh.
set -euo pipefail
a=$1 b=$2 addr_a=$3 addr_b=$4 plen=${5:-24}
ip netns add "$a"
ip netns add "$b"
# veth names: at most 15 chars; derived from the namespace names.
va="v${a:0:12}" vb="v${b:0:12}"
ip link add "$va" netns "$a" type veth peer name "$vb" netns "$b"
ip -n "$a" addr add "$addr_a/$plen" dev "$va"
ip -n "$b" addr add "$addr_b/$plen" dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up
ip -n "$b" link set "$vb" up
ip -n "$a" link show "$va" | grep -q "state UP" || true
echo "netns up: $a($addr_a) <-> $b($addr_b)"
