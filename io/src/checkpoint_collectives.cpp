// The collectives of a checkpoint save, over the data-parallel communicator: 64-bit integers
// (DType::I64) and bytes (DType::U8) as they are, so hashes, offsets and checksums need no
// packing.
#include <algorithm>
#include <chrono>
#include <thread>

#include "checkpoint_internal.h"
#include "ds/core/error.h"

namespace ds::io::detail {

namespace {
TensorView i64_view(std::int64_t* p, std::size_t n) { return TensorView{p, n, DType::I64}; }
}  // namespace

SaveAgreement agree_on_save(Communicator& comm, std::uint64_t tag_hash, std::uint64_t layout_hash, std::uint64_t id,
                            double timeout_s, const std::string& save_dir, const std::string& tag) {
  // One max-reduction: tag hash and its negation (max and -min: equal on every rank when the
  // two agree), the same for the layout hash, and rank 0's id (the others send 0). Hashes are
  // cut to 62 bits so that negating them cannot overflow.
  constexpr std::uint64_t kHashMask = (std::uint64_t(1) << 62) - 1;
  const auto th = std::int64_t(tag_hash & kHashMask), lh = std::int64_t(layout_hash & kHashMask);
  // Leaked if the deadline passes: MPI may still write it when the other ranks arrive.
  auto* first = new std::vector<std::int64_t>{th, -th, lh, -lh, std::int64_t(id)};
  if (comm.size() > 1) {
    CommWork work = comm.iall_reduce(i64_view(first->data(), first->size()), ReduceOp::Max);
    if (timeout_s <= 0) {
      work->wait();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      while (!work->test()) {
        if (std::chrono::steady_clock::now() > deadline) {
          (void)work.release();  // the operation may still complete; its buffer stays alive
          DS_THROW("save_checkpoint('" << save_dir << "', tag '" << tag << "'): rank " << comm.rank() << " waited "
                   << timeout_s << " s for the other ranks at the first collective of the save. save_checkpoint is "
                      "collective: every rank must call it (the communicator is now unusable; end the job)");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }
  const std::vector<std::int64_t> r = std::move(*first);
  delete first;
  return SaveAgreement{r[0] == -r[1], r[2] == -r[3], std::uint64_t(r[4])};
}

std::string broadcast_tag(Communicator& comm, const std::string& tag) {
  std::vector<std::uint8_t> tb(256, 0);
  if (comm.rank() == 0) {
    DS_CHECK(tag.size() < tb.size(), "checkpoint tag longer than " << tb.size() - 1 << " bytes");
    std::copy(tag.begin(), tag.end(), tb.begin());
  }
  comm.broadcast(TensorView{tb.data(), tb.size(), DType::U8}, 0);
  std::string t0;
  for (std::uint8_t c : tb) {
    if (c == 0) break;
    t0 += char(c);
  }
  return t0;
}

std::int64_t max_status(Communicator& comm, std::int64_t status) {
  if (comm.size() > 1) comm.all_reduce(i64_view(&status, 1), ReduceOp::Max);
  return status;
}

std::vector<ShardReport> gather_reports(Communicator& comm, const ShardReport& mine, std::size_t k) {
  // Every report is as long as the longest range list (found first) so one all-gather of
  // equal blocks carries them: ok, has_shard, offset, count, #ranges, crc..., (offset, count)...
  const std::size_t size = std::size_t(comm.size());
  std::int64_t nr = std::int64_t(mine.ranges.size());
  if (size > 1) comm.all_reduce(i64_view(&nr, 1), ReduceOp::Max);
  const std::size_t R = std::size_t(nr);
  const std::size_t L = 5 + k + 2 * R;
  std::vector<std::int64_t> send(L, 0), recv(L * size, 0);
  send[0] = mine.ok ? 1 : 0;
  send[1] = mine.has_shard ? 1 : 0;
  send[2] = std::int64_t(mine.offset);
  send[3] = std::int64_t(mine.count);
  send[4] = std::int64_t(mine.ranges.size());
  for (std::size_t i = 0; i < k && i < mine.crcs.size(); ++i) send[5 + i] = mine.crcs[i];
  for (std::size_t i = 0; i < mine.ranges.size(); ++i) {
    send[5 + k + 2 * i] = std::int64_t(mine.ranges[i].offset);
    send[5 + k + 2 * i + 1] = std::int64_t(mine.ranges[i].count);
  }
  if (size > 1) comm.all_gather(i64_view(send.data(), send.size()), i64_view(recv.data(), recv.size()));
  else recv = send;
  std::vector<ShardReport> out(size);
  for (std::size_t r = 0; r < size; ++r) {
    const std::int64_t* p = &recv[r * L];
    out[r].ok = p[0] == 1;
    out[r].has_shard = p[1] == 1;
    out[r].offset = std::uint64_t(p[2]);
    out[r].count = std::uint64_t(p[3]);
    const std::size_t n = std::min(std::size_t(p[4]), R);
    for (std::size_t i = 0; i < k; ++i) out[r].crcs.push_back(std::uint32_t(p[5 + i]));
    for (std::size_t i = 0; i < n; ++i)
      out[r].ranges.push_back({std::size_t(p[5 + k + 2 * i]), std::size_t(p[5 + k + 2 * i + 1])});
  }
  return out;
}

}  // namespace ds::io::detail
