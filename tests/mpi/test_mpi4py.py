"""mpi4py interop: a Python program hands its communicators (COMM_WORLD and a sub-communicator
made with Split) to libds_capi.so through comm.py2f(); dstrain's all-reduce (shared-memory path
included) must give exact results on each of them.

Run: mpirun -np 2 /usr/bin/python3 tests/mpi/test_mpi4py.py build/mpi/libds_capi.so
"""
import ctypes
import sys

import numpy as np
from mpi4py import MPI

lib = ctypes.CDLL(sys.argv[1])
lib.ds_allreduce.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_int]
lib.ds_allreduce_sum_f32.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong]
lib.ds_allreduce_sum_f64.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong]
lib.ds_comm_uses_shm.argtypes = [ctypes.c_int]
lib.ds_capi_last_error.restype = ctypes.c_char_p

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
assert MPI.Query_thread() == MPI.THREAD_MULTIPLE


def values(r, n, dtype):
    i = np.arange(n, dtype=np.int64)
    return (((i * 7 + r * 3 + (i >> 5)) % 17) - 8).astype(dtype)


def check(comm, n, dtype, code=None):
    """All-reduce sum through the library on `comm`; compare exactly with the sum of every
    member's input (members are identified by their world rank)."""
    members = comm.allgather(rank)
    x = values(rank, n, dtype)
    if code is None:
        fn = lib.ds_allreduce_sum_f32 if dtype == np.float32 else lib.ds_allreduce_sum_f64
        rc = fn(comm.py2f(), x.ctypes.data, n)
    else:
        rc = lib.ds_allreduce(comm.py2f(), x.ctypes.data, n, code, 0)
    assert rc == 0, lib.ds_capi_last_error()
    expect = sum(values(m, n, np.float64) for m in members).astype(dtype)
    bad = int(np.count_nonzero(x != expect))
    assert bad == 0, f"rank {rank}: {bad} of {n} wrong ({np.dtype(dtype).name}, comm size {comm.Get_size()})"
    # the same all-reduce through mpi4py itself agrees bit for bit (fp32/fp64)
    if dtype in (np.float32, np.float64):
        y = values(rank, n, dtype)
        comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)
        assert np.array_equal(x, y)


for n in (1, 7, 278011):
    check(world, n, np.float32)
    check(world, n, np.float64)
    check(world, n, np.float16, code=1)
    check(world, n, np.int32, code=4)

if size > 1:
    assert lib.ds_comm_uses_shm(world.py2f()) == 1, lib.ds_capi_last_error()

# A sub-communicator whose rank order is the reverse of the world's, and one split in halves.
rev = world.Split(color=0, key=size - rank)
assert rev.Get_rank() == size - 1 - rank
for n in (7, 278011):
    check(rev, n, np.float32)
halves = world.Split(color=rank % 2, key=rank)
check(halves, 278011, np.float32)
check(halves, 5, np.float64)
rev.Free()  # frees the library's communicator attached to it
check(world, 1000, np.float32)

# Errors come back as a return code and a message, not a crash.
x = np.zeros(4, dtype=np.float32)
assert lib.ds_allreduce(world.py2f(), x.ctypes.data, 4, 9, 0) != 0
assert b"dtype" in lib.ds_capi_last_error()

# mpi4py keeps working on the same communicators afterwards.
assert world.allreduce(1) == size
assert halves.allreduce(1) == halves.Get_size()
print(f"test_mpi4py: rank {rank}/{size} OK", flush=True)
