// Hugging Face weights <-> dstrain parameters: the name and layout tables, and loading a
// safetensors file (or sharded directory) into a model's parameter list.
//
// One Architecture per model family is a table of rules "our name pattern -> HF name pattern,
// transposed or not" ("{l}" stands for the layer index), plus the optional prefix HF puts on
// the base model's names, the buffers HF files carry that are no parameters, and the tensors
// that duplicate a tied one. GPT-2: HF's Conv1D stores c_attn / c_proj / c_fc weights as
// [in, out], ours (PyTorch Linear) are [out, in], so those four are transposed; the names
// are ours with an optional "transformer." prefix; lm_head.weight is wte.weight (tied);
// h.N.attn.bias / masked_bias are the causal-mask buffers. Llama: names and layouts are HF's
// (ds/nn/llama_layout.h), the table only says which file tensors to skip. Another family is
// one more table.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/core/module.h"
#include "ds/io/safetensors.h"

namespace ds::io::hf {

struct Rule {
  std::string_view ours;  // "h.{l}.attn.c_attn.weight"
  std::string_view hf;    // its HF name without the prefix
  bool transpose;         // the HF tensor is ours transposed (2-D)
  bool crop_rows;         // the HF tensor may have more rows; the first ones are ours (positions)
};

struct Tied {
  std::string_view hf;     // "lm_head.weight"
  std::string_view same_as;  // the HF name (without prefix) it must equal: "wte.weight"
};

struct Architecture {
  std::string_view name;                      // "gpt2"
  std::span<const Rule> rules;
  std::span<const std::string_view> prefixes;  // stripped from file names: "transformer."
  std::span<const std::string_view> ignored;   // HF buffers (patterns), not parameters
  std::span<const Tied> tied;
};

const Architecture& gpt2();
// Llama (LlamaForCausalLM): our names and layouts are HF's; the table accounts for the
// rotary inv_freq buffer and a tied model's lm_head.weight.
const Architecture& llama();
// Every architecture there is a table for.
std::span<const Architecture* const> architectures();

// The architecture whose rules name every one of `params`; nullptr when none does.
const Architecture* detect(std::span<const ParamInfo> params);

// A parameter's Hugging Face name (no prefix) and shape (transposed where the rule says).
struct HfTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  bool transpose = false;
};
// params in HF terms; throws naming a parameter that no rule of `arch` covers.
std::vector<HfTensor> to_hf(const Architecture& arch, std::span<const ParamInfo> params);

// out (rows x cols, row-major) = in (cols x rows) transposed.
void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols);

// Where each parameter comes from in a file, checked: every parameter found with its shape,
// every file tensor used, tied to a used one, or a known buffer. The file may hold our names
// (as ds_to_fp32 writes them) or the HF names of an architecture that covers `params`.
struct LoadPlan {
  struct Source {
    const SafetensorsTensor* tensor = nullptr;
    bool transpose = false;
    std::int64_t rows = 0, cols = 0;  // our shape as 2-D (transposed and cropped tensors)
    bool crop = false;                // read the first `rows` rows of a longer tensor
  };
  std::vector<Source> sources;  // one per parameter
  std::vector<std::pair<const SafetensorsTensor*, const SafetensorsTensor*>> tied;  // (copy, original)
  std::string naming;  // "dstrain names" or "Hugging Face gpt2 names"
  std::size_t ignored = 0;  // buffers skipped
};
LoadPlan plan_load(const SafetensorsReader& file, std::span<const ParamInfo> params);

// Reads the planned tensors into out[i] (params[i].numel() floats) and checks tied copies are
// equal to their originals.
void load(const SafetensorsReader& file, const LoadPlan& plan, std::span<const ParamInfo> params,
          std::span<const std::span<float>> out);

}  // namespace ds::io::hf
