# Source me: Open MPI as root on a small shared machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_plm_rsh_args="-o BatchMode=yes -o ConnectTimeout=5"
export HWLOC_HIDE_ERRORS=2
