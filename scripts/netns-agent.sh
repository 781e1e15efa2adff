#!/usr/bin/env bash
# Open MPI remote agent (OMPI_MCA_plm_rsh_agent) that "logs in" to a network namespace
# instead of ssh: finds the target host among its arguments, maps it to a namespace through
# DS_NETNS_HOSTS ("10.99.7.1=dsA 10.99.7.2=dsB"), and runs the remaining words through a
# shell inside that namespace, exactly as sshd would run the remote command. The command
# also gets its own UTS namespace with the namespace's name as host name, so the two
# "hosts" differ in name as real machines do (MPI_Get_processor_name, Open MPI's session
# directories and shared-memory segment names all use it).
set -euo pipefail
declare -A map
for kv in ${DS_NETNS_HOSTS:?DS_NETNS_HOSTS not set}; do map[${kv%%=*}]=${kv#*=}; done
while [ $# -gt 0 ]; do
  if [ -n "${map[$1]:-}" ]; then
    ns=${map[$1]}
    shift
    exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"
  fi
  shift   # ssh options (-x, -o K=V ...) are meaningless here
done
echo "netns-agent: no known host in the arguments (DS_NETNS_HOSTS=$DS_NETNS_HOSTS)" >&2
exit 255
