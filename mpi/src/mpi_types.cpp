// MPI datatypes and ops (mpi_types.h).
#include "mpi_types.h"

#include <algorithm>
#include <cstdint>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "check.h"
#include "ds/mpi/mpi_comm.h"

namespace ds {

namespace {

bool is_reducible(DType t) {
  switch (t) {
    case DType::F32: case DType::F64: case DType::F16: case DType::BF16: case DType::I32: case DType::I64:
      return true;
    default:
      return false;
  }
}

// fp16 / bf16 reductions for MPI: widen to fp32 in blocks, reduce, round back.
template <DType T, ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kBlock = 512;
  float a[kBlock], b[kBlock];
  auto* src = static_cast<std::uint16_t*>(in);
  auto* dst = static_cast<std::uint16_t*>(inout);
  for (int off = 0; off < *len; off += kBlock) {
    const int k = std::min(kBlock, *len - off);
    convert(src + off, T, a, DType::F32, k);
    convert(dst + off, T, b, DType::F32, k);
    for (int i = 0; i < k; ++i) {
      if constexpr (Op == ReduceOp::Sum) b[i] = a[i] + b[i];
      else if constexpr (Op == ReduceOp::Max) b[i] = a[i] > b[i] ? a[i] : b[i];
      else b[i] = a[i] < b[i] ? a[i] : b[i];
    }
    convert(b, DType::F32, dst + off, T, k);
  }
}

struct HalfOps {
  MPI_Datatype type = MPI_DATATYPE_NULL;  // 2 contiguous bytes
  MPI_Op ops[2][3] = {};                  // [f16, bf16][sum, max, min]
};

HalfOps& half_ops() {
  static HalfOps h = [] {
    HalfOps o;
    DS_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &o.type));
    DS_MPI_CHECK(MPI_Type_commit(&o.type));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::F16, ReduceOp::Sum>, 1, &o.ops[0][0]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::F16, ReduceOp::Max>, 1, &o.ops[0][1]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::F16, ReduceOp::Min>, 1, &o.ops[0][2]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::BF16, ReduceOp::Sum>, 1, &o.ops[1][0]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::BF16, ReduceOp::Max>, 1, &o.ops[1][1]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::BF16, ReduceOp::Min>, 1, &o.ops[1][2]));
    return o;
  }();
  return h;
}


template <typename T>
void divide_typed(T* p, std::size_t n, int by) {
  const T d = static_cast<T>(by);
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

}  // namespace

namespace detail {

void check_op(ReduceOp op, DType t, const char* what) {
  if (op != ReduceOp::Sum && op != ReduceOp::Avg && op != ReduceOp::Max && op != ReduceOp::Min)
    DS_THROW("MpiComm::" << what << ": unsupported reduce op #" << int(op) << " with dtype " << dtype_name(t));
  if (!is_reducible(t))
    DS_THROW("MpiComm::" << what << ": op " << reduce_op_name(op) << " is not supported for dtype " << dtype_name(t)
             << " by the mpi backend (supported: fp32, fp64, fp16, bf16, int32, int64)");
}

// avg = sum / size, applied after the sum on every path (so both paths round alike).
void divide(void* p, std::size_t n, DType t, int by) {
  if (by == 1 || n == 0) return;
  switch (t) {
    case DType::F32: divide_typed(static_cast<float*>(p), n, by); break;
    case DType::F64: divide_typed(static_cast<double*>(p), n, by); break;
    case DType::I32: divide_typed(static_cast<std::int32_t*>(p), n, by); break;
    case DType::I64: divide_typed(static_cast<std::int64_t*>(p), n, by); break;
    case DType::F16: case DType::BF16: {
      constexpr std::size_t kBlock = 1024;
      float a[kBlock];
      auto* h = static_cast<std::uint16_t*>(p);
      const float d = static_cast<float>(by);
      for (std::size_t off = 0; off < n; off += kBlock) {
        const std::size_t k = std::min(kBlock, n - off);
        convert(h + off, t, a, DType::F32, k);
        for (std::size_t i = 0; i < k; ++i) a[i] = a[i] / d;
        convert(a, DType::F32, h + off, t, k);
      }
      break;
    }
    default: DS_THROW("avg is not supported for dtype " << dtype_name(t));
  }
}

}  // namespace detail

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::F16: case DType::BF16: return half_ops().type;
  }
  DS_THROW("no MPI datatype for dtype #" << int(t));
}

MPI_Op mpi_reduce_op(ReduceOp op, DType t) {
  detail::check_op(op, t, "reduce");
  if (t == DType::F16 || t == DType::BF16) {
    const int k = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
    return half_ops().ops[t == DType::F16 ? 0 : 1][k];
  }
  return op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
}

}  // namespace ds
