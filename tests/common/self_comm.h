// A one-rank ds::Communicator for single-process tests: collectives are identities (copies).
#pragma once

#include <cstring>
#include <memory>

#include "ds/core/error.h"
#include "ds/mpi/communicator.h"

namespace ds::test {

class SelfComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "self"; }
  void all_reduce(TensorView, ReduceOp) override {}
  CommWork iall_reduce(TensorView, ReduceOp) override { return std::make_unique<Done>(); }
  void reduce_scatter(TensorView s, TensorView r, ReduceOp) override { copy(s, r); }
  CommWork ireduce_scatter(TensorView s, TensorView r, ReduceOp) override { copy(s, r); return std::make_unique<Done>(); }
  void all_gather(TensorView s, TensorView r) override { copy(s, r); }
  CommWork iall_gather(TensorView s, TensorView r) override { copy(s, r); return std::make_unique<Done>(); }
  void broadcast(TensorView, int) override {}
  void barrier() override {}

 private:
  struct Done final : CommHandle {
    void wait() override {}
    bool test() override { return true; }
  };
  // With one rank, send and receive hold the same number of elements of the same type.
  static void copy(TensorView s, TensorView r) {
    DS_CHECK(s.count == r.count && s.dtype == r.dtype, "SelfComm: count/dtype mismatch");
    if (s.data != r.data) std::memmove(r.data, s.data, s.bytes());
  }
};

}  // namespace ds::test
