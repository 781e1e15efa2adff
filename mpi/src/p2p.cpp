// PeerLink (ds/mpi/p2p.h): MPI_Isend / MPI_Irecv on the link's own duplicate communicator.
#include "ds/mpi/p2p.h"

#include <algorithm>
#include <climits>

#include "check.h"

namespace ds {

namespace {

constexpr std::size_t kMaxMessage = std::size_t(1) << 30;  // bytes per MPI message (< INT_MAX)

// One request per piece of at most kMaxMessage bytes, in order.
template <typename Post>
std::vector<MPI_Request> post_pieces(std::size_t bytes, Post post) {
  std::vector<MPI_Request> out;
  std::size_t off = 0;
  do {
    const std::size_t n = std::min(kMaxMessage, bytes - off);
    out.push_back(post(off, int(n)));
    off += n;
  } while (off < bytes);
  return out;
}

}  // namespace

P2PRequest& P2PRequest::operator=(P2PRequest&& o) noexcept {
  if (this != &o) {
    try {
      wait();
    } catch (...) {
    }
    requests_ = std::move(o.requests_);
    o.requests_.clear();
  }
  return *this;
}

P2PRequest::~P2PRequest() {
  if (requests_.empty()) return;
  MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
}

void P2PRequest::wait() {
  if (requests_.empty()) return;
  std::vector<MPI_Request> r = std::move(requests_);
  requests_.clear();
  DS_MPI_CHECK(MPI_Waitall(int(r.size()), r.data(), MPI_STATUSES_IGNORE));
}

PeerLink::PeerLink(MPI_Comm comm) {
  DS_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

PeerLink::~PeerLink() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

P2PRequest PeerLink::isend(const void* data, std::size_t bytes, int peer, int tag) {
  const char* base = static_cast<const char*>(data);
  return P2PRequest(post_pieces(bytes, [&](std::size_t off, int n) {
    MPI_Request r;
    DS_MPI_CHECK(MPI_Isend(base + off, n, MPI_BYTE, peer, tag, comm_, &r));
    return r;
  }));
}

P2PRequest PeerLink::irecv(void* data, std::size_t bytes, int peer, int tag) {
  char* base = static_cast<char*>(data);
  return P2PRequest(post_pieces(bytes, [&](std::size_t off, int n) {
    MPI_Request r;
    DS_MPI_CHECK(MPI_Irecv(base + off, n, MPI_BYTE, peer, tag, comm_, &r));
    return r;
  }));
}

void PeerLink::recv(void* data, std::size_t bytes, int peer, int tag) {
  char* base = static_cast<char*>(data);
  std::size_t off = 0;
  do {
    const std::size_t n = std::min(kMaxMessage, bytes - off);
    MPI_Status st;
    DS_MPI_CHECK(MPI_Recv(base + off, int(n), MPI_BYTE, peer, tag, comm_, &st));
    int got = 0;
    DS_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
    DS_CHECK(std::size_t(got) == n, "PeerLink::recv: rank " << peer << " sent " << got << " bytes with tag " << tag
                                                            << ", expected " << n);
    off += n;
  } while (off < bytes);
}

}  // namespace ds
