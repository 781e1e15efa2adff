#include "sample.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "report.h"

namespace ds::train {

namespace {

// The first tokens of the validation split (the training split when it is empty).
std::vector<std::int32_t> data_prompt(const Job& j) {
  const auto seq = std::size_t(j.spec.block_size);
  if (j.train_shards) {
    const data::TokenShards& src = j.val_shards->size() > 0 ? *j.val_shards : *j.train_shards;
    return src.head(std::min<std::size_t>({src.size(), 32, seq}));
  }
  const data::TextDataset& src = j.val_data.size() > 0 ? j.val_data : j.train_data;
  const auto toks = src.tokens();
  return {toks.begin(), toks.begin() + std::ptrdiff_t(std::min<std::size_t>({toks.size(), 32, seq}))};
}

// Bytes are tokens, or the tokenizer's bytes ('?' for ids it does not have); control bytes
// print as '?' either way, and UTF-8 survives with a tokenizer.
std::string text_of(const Job& j, const std::vector<std::int32_t>& ids) {
  std::string s;
  for (auto t : ids) {
    const std::string* b = j.tokenizer ? j.tokenizer->token_bytes(t) : nullptr;
    if (b) {
      for (unsigned char c : *b) s.push_back(c < 32 && c != '\n' && c != '\t' ? '?' : char(c));
    } else {
      s += printable(std::string(1, char(!j.tokenizer && t < 256 ? t : '?')));
    }
  }
  return s;
}

}  // namespace

void print_sample(const Job& j, bool on_this_rank, bool rank0, std::uint64_t sample_seed) {
  // Token shards hold ids of a tokenizer train does not have (without --tokenizer): no text to show.
  const bool no_text = j.train_shards && !j.tokenizer;
  if (rank0 && no_text)
    std::printf("[train] no text sample: %s holds token ids, not bytes (--tokenizer decodes them)\n",
                j.opts.data.c_str());
  if (!on_this_rank || no_text) return;
  std::vector<std::int32_t> prompt = data_prompt(j);
  const std::size_t plen = prompt.size();
  if (!j.prompt.empty()) prompt = j.prompt;
  auto out = j.model.generate(prompt, int(j.opts.sample_tokens), 0.8f, sample_seed);
  if (!rank0) return;
  const char* unit = j.tokenizer ? "tokens" : "bytes";
  if (!j.prompt.empty())
    std::printf("[train] sample (temperature 0.8, prompt = --prompt, %zu %s):\n", prompt.size(), unit);
  else
    std::printf("[train] sample (temperature 0.8, prompt = first %zu %s of the validation split):\n", plen, unit);
  std::printf("%s%s\n[train] end of sample\n", text_of(j, prompt).c_str(), text_of(j, out).c_str());
}

}  // namespace ds::train
