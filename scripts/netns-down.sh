#!/usr/bin/env bash
# Remove namespaces made by netns-up.sh (their veth ends go with them) after stopping any
# process still running inside them. Usage: netns-down.sh NAME...
for ns in "$@"; do
  if ip netns list | grep -qw "$ns"; then
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns delete "$ns" || true
  fi
done
