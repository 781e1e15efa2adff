// What the Loader reads samples from: anything that cuts a token stream into training windows
// (TextDataset in memory, TokenShards memory-mapped). Sample i is a window of seq+1 tokens:
// inputs are its first seq tokens, targets the same shifted by one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds::data {

class WindowSource {
 public:
  virtual ~WindowSource() = default;
  // Tokens in the stream (all windows together never cover more).
  virtual std::size_t size() const = 0;
  virtual std::size_t num_samples(std::int64_t seq) const = 0;
  // Writes sample `index` (inputs and targets, seq tokens each); throws ds::Error when out
  // of range.
  virtual void sample(std::size_t index, std::int64_t seq, std::int32_t* inputs,
                      std::int32_t* targets) const = 0;

 protected:
  WindowSource() = default;
  WindowSource(const WindowSource&) = default;
  WindowSource(WindowSource&&) = default;
  WindowSource& operator=(const WindowSource&) = default;
  WindowSource& operator=(WindowSource&&) = default;
};

}  // namespace ds::data
