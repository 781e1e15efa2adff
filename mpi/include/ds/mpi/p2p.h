// Point-to-point transfers between the ranks of one MPI communicator: what a pipeline's
// stages send each other (activations forward, their gradients back, tied weights).
//
// Sends are non-blocking: isend() returns at once and its buffer must stay valid and
// unchanged until the request completes (wait(), or the request's destruction, which waits).
// Messages between two ranks with the same tag arrive in the order they were sent (MPI's
// non-overtaking rule), so a schedule that sends and receives in the same order needs no
// sequence numbers. Transfers above INT_MAX bytes go as several messages of the same tag.
// Not thread-safe: one thread per PeerLink (MPI_THREAD_FUNNELED is enough).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace ds {

class P2PRequest {
 public:
  P2PRequest() = default;
  explicit P2PRequest(std::vector<MPI_Request> requests) : requests_(std::move(requests)) {}
  P2PRequest(P2PRequest&& o) noexcept : requests_(std::move(o.requests_)) { o.requests_.clear(); }
  P2PRequest& operator=(P2PRequest&& o) noexcept;
  P2PRequest(const P2PRequest&) = delete;
  P2PRequest& operator=(const P2PRequest&) = delete;
  ~P2PRequest();  // waits (errors are lost there: call wait() to see them)

  // Blocks until the transfer completed; throws ds::Error naming MPI's error.
  void wait();
  bool pending() const { return !requests_.empty(); }

 private:
  std::vector<MPI_Request> requests_;
};

class PeerLink {
 public:
  // Duplicates `comm` (its own message space, MPI_ERRORS_RETURN); the duplicate is freed with
  // the link. Collective over `comm`.
  explicit PeerLink(MPI_Comm comm);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  P2PRequest isend(const void* data, std::size_t bytes, int peer, int tag);
  P2PRequest irecv(void* data, std::size_t bytes, int peer, int tag);
  // Blocks until `bytes` arrived from `peer`; a message of another size is a ds::Error.
  void recv(void* data, std::size_t bytes, int peer, int tag);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace ds
