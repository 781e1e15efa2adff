// libds_capi.so: extern "C" wrappers over MpiComm for mpi4py programs (capi.h).
#include "ds/mpi/capi.h"

#include <memory>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "check.h"
#include "ds/mpi/mpi_comm.h"

namespace {

thread_local std::string g_last_error;
int g_keyval = MPI_KEYVAL_INVALID;
int g_self_keyval = MPI_KEYVAL_INVALID;
std::vector<MPI_Comm> g_cached;  // user communicators that carry one of our MpiComms

// The user's communicator is being freed (or MPI finalized): free our MpiComm with it.
int delete_cached(MPI_Comm comm, int, void* value, void*) {
  delete static_cast<ds::MpiComm*>(value);
  std::erase(g_cached, comm);
  return MPI_SUCCESS;
}

// Runs first in MPI_Finalize (attributes of MPI_COMM_SELF): release every cached MpiComm
// while MPI still works, newest first.
int on_finalize(MPI_Comm, int, void*, void*) {
  while (!g_cached.empty()) {
    MPI_Comm c = g_cached.back();
    if (MPI_Comm_delete_attr(c, g_keyval) != MPI_SUCCESS) g_cached.pop_back();
  }
  return MPI_SUCCESS;
}

ds::MpiComm& comm_for(MPI_Fint fcomm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) DS_THROW("ds_capi: MPI is not initialized (import mpi4py.MPI first)");
  MPI_Comm comm = MPI_Comm_f2c(fcomm);
  if (comm == MPI_COMM_NULL) DS_THROW("ds_capi: communicator handle " << fcomm << " is MPI_COMM_NULL");
  if (g_keyval == MPI_KEYVAL_INVALID) {
    DS_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_cached, &g_keyval, nullptr));
    DS_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &g_self_keyval, nullptr));
    DS_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, g_self_keyval, nullptr));
  }
  void* value = nullptr;
  int found = 0;
  DS_MPI_CHECK(MPI_Comm_get_attr(comm, g_keyval, &value, &found));
  if (found) return *static_cast<ds::MpiComm*>(value);
  auto c = std::make_unique<ds::MpiComm>(comm);  // collective: every rank gets here together
  DS_MPI_CHECK(MPI_Comm_set_attr(comm, g_keyval, c.get()));
  g_cached.push_back(comm);
  return *c.release();
}

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown error";
  }
  return 1;
}

}  // namespace

extern "C" {

int ds_allreduce(MPI_Fint comm, void* data, long long n, int dtype, int op) {
  return guarded([&] {
    static const ds::DType kTypes[] = {ds::DType::F32, ds::DType::F16, ds::DType::BF16,
                                       ds::DType::F64, ds::DType::I32, ds::DType::I64};
    if (dtype < 0 || dtype > 5) DS_THROW("ds_allreduce: dtype code " << dtype << " is not 0..5");
    if (op < 0 || op > 3) DS_THROW("ds_allreduce: op code " << op << " is not 0..3");
    if (n < 0) DS_THROW("ds_allreduce: negative element count " << n);
    comm_for(comm).all_reduce(ds::TensorView{data, static_cast<std::size_t>(n), kTypes[dtype]},
                              static_cast<ds::ReduceOp>(op));
  });
}

int ds_allreduce_sum_f32(MPI_Fint comm, float* data, long long n) { return ds_allreduce(comm, data, n, 0, 0); }
int ds_allreduce_sum_f64(MPI_Fint comm, double* data, long long n) { return ds_allreduce(comm, data, n, 3, 0); }

int ds_comm_uses_shm(MPI_Fint comm) {
  int result = -1;
  if (guarded([&] { result = comm_for(comm).shm_enabled() ? 1 : 0; }) != 0) return -1;
  return result;
}

const char* ds_capi_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
