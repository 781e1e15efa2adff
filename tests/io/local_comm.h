// A one-rank ds::Communicator for single-process tests of the checkpoint store.
#pragma once

#include <cstring>

#include "ds/core/error.h"
#include "ds/mpi/communicator.h"

namespace ds::io::test {

class LocalComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  void all_reduce(TensorView, ReduceOp) override {}
  CommWork iall_reduce(TensorView, ReduceOp) override { return std::make_unique<Done>(); }
  void reduce_scatter(TensorView send, TensorView recv, ReduceOp) override { copy(send, recv); }
  CommWork ireduce_scatter(TensorView send, TensorView recv, ReduceOp) override {
    copy(send, recv);
    return std::make_unique<Done>();
  }
  void all_gather(TensorView send, TensorView recv) override { copy(send, recv); }
  CommWork iall_gather(TensorView send, TensorView recv) override {
    copy(send, recv);
    return std::make_unique<Done>();
  }
  void broadcast(TensorView, int) override {}
  void barrier() override {}

 private:
  struct Done final : CommHandle {
    void wait() override {}
    bool test() override { return true; }
  };
  static void copy(TensorView s, TensorView r) {
    DS_CHECK(s.count == r.count && s.dtype == r.dtype, "LocalComm: count/dtype mismatch");
    if (s.data != r.data) std::memcpy(r.data, s.data, s.bytes());
  }
};

}  // namespace ds::io::test
