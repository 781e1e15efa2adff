// safetensors reader/writer (round trips in F32/F16/BF16, sharded directories, every header
// error the reader names) and the Hugging Face GPT-2 name table (load plans and their errors).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "ds/core/half.h"
#include "ds/io/hf_weights.h"
#include "ds/io/safetensors.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace ds;
using namespace ds::io;

namespace {

// A file from a raw header text and data bytes (the length prefix computed).
void write_raw(const fs::path& p, const std::string& header, std::size_t data_bytes, std::uint64_t len_override = 0) {
  std::ofstream f(p, std::ios::binary);
  const std::uint64_t n = len_override ? len_override : header.size();
  for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
  f << header << std::string(data_bytes, '\0');
}

std::vector<float> iota(std::size_t n, float start = 0.5f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + float(i) * 0.25f;
  return v;
}

std::vector<float> read_all(const SafetensorsReader& r, const std::string& name) {
  const auto* t = r.find(name);
  EXPECT_NE(t, nullptr) << name;
  std::vector<float> v(t ? t->numel() : 0);
  r.read_f32(name, v);
  return v;
}

}  // namespace

TEST(Safetensors, RoundTripF32F16Bf16) {
  TempDir d("ds_st");
  const fs::path p = d.path / "a.safetensors";
  const auto a = iota(6), b = iota(4, -1.0f), c = iota(3, 2.0f);
  {
    SafetensorsWriter w(p.string(), {{"a.weight", DType::F32, {2, 3}}, {"b", DType::F16, {4}}, {"c", DType::BF16, {3, 1}}},
                        {{"format", "pt"}});
    w.write(a);
    w.write(b);
    w.write(c);
    w.close();
  }
  // The reference layout: header length a multiple of 8, data right after it.
  std::ifstream in(p, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
  SafetensorsReader r(p.string());
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.find("a.weight")->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(r.find("b")->dtype, "F16");
  EXPECT_EQ(r.find("c")->dtype, "BF16");
  EXPECT_EQ(read_all(r, "a.weight"), a);
  EXPECT_EQ(read_all(r, "b"), b);  // these values are exact in fp16 and bf16
  EXPECT_EQ(read_all(r, "c"), c);
}

TEST(Safetensors, WriterChecksCountsAndOrder) {
  TempDir d("ds_st");
  const std::string p = (d.path / "w.safetensors").string();
  SafetensorsWriter w(p, {{"x", DType::F32, {2}}, {"y", DType::F32, {1}}});
  EXPECT_HAS(error_of([&] { w.write(iota(3)); }), "tensor 'x' takes 2 values, got 3");
  w.write(iota(2));
  EXPECT_HAS(error_of([&] { w.close(); }), "closed after 1 of 2 tensors (next: 'y')");
  EXPECT_HAS(error_of([&] { SafetensorsWriter(p, {{"i", DType::I32, {1}}}); }), "takes F32, F16 or BF16, not int32");
}

TEST(Safetensors, ShardedDirectory) {
  TempDir d("ds_st");
  {
    SafetensorsWriter w((d.path / "m-1.safetensors").string(), {{"x", DType::F32, {2}}});
    w.write(iota(2));
    w.close();
    SafetensorsWriter v((d.path / "m-2.safetensors").string(), {{"y", DType::F32, {3}}});
    v.write(iota(3, 7.0f));
    v.close();
  }
  std::ofstream(d.path / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 20}, "weight_map": {"x": "m-1.safetensors", "y": "m-2.safetensors"}})";
  SafetensorsReader r(d.path.string());
  EXPECT_EQ(read_all(r, "y"), iota(3, 7.0f));
  EXPECT_EQ(r.tensors().size(), 2u);

  std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map": {"x": "m-2.safetensors", "y": "m-2.safetensors"}})";
  EXPECT_HAS(error_of([&] { SafetensorsReader x(d.path.string()); }), "the index puts tensor 'x' in m-2.safetensors, which does not hold it");
  std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map": {"x": "../m-1.safetensors"}})";
  EXPECT_HAS(error_of([&] { SafetensorsReader x(d.path.string()); }), "not a file in");
  TempDir e("ds_st");
  EXPECT_HAS(error_of([&] { SafetensorsReader x(e.path.string()); }),
             "holds neither model.safetensors.index.json nor model.safetensors");
}

TEST(Safetensors, HeaderErrorsNameFileAndTensor) {
  TempDir d("ds_st");
  const fs::path p = d.path / "bad.safetensors";
  auto err = [&] { return error_of([&] { SafetensorsFile f(p.string()); }); };

  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_HAS(err(), "shorter than the 8-byte header length");
  write_raw(p, "{}", 0, 1000);
  EXPECT_HAS(err(), "bad header length 1000: the file holds only 2 bytes after it");
  write_raw(p, "{}", 0, std::uint64_t(1) << 40);
  EXPECT_HAS(err(), "bad header length 1099511627776 (over the format's cap");
  write_raw(p, "{nope", 0);
  EXPECT_HAS(err(), "the header is not valid JSON");
  // JSON alone: the comments and trailing commas a config may hold are refused here.
  write_raw(p, "{} // x", 0);
  EXPECT_HAS(err(), "the header is not valid JSON (a comment (not JSON) (line 1, column 4))");
  write_raw(p, R"({"__metadata__": {"a": "b"},})", 0);
  EXPECT_HAS(err(), "the header is not valid JSON (a trailing comma (not JSON) (line 1, column 29))");
  write_raw(p, R"({"t": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_HAS(err(), p.string() + ": tensor 't': unknown dtype \"Q7\"");
  write_raw(p, R"({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12);
  EXPECT_HAS(err(), "tensor 't': shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] hold 12");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  EXPECT_HAS(err(), "tensor 'b' data_offsets [4, 8] overlap tensor 'a' [0, 8]");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  EXPECT_HAS(err(), "tensor 'a' data_offsets [4, 8] leave a gap after byte 0");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  EXPECT_HAS(err(), "tensor 'a' data_offsets end at byte 16 but the file's data section holds 8 bytes");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8);
  EXPECT_HAS(err(), "the data section holds 8 bytes but the tensors cover 4");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  EXPECT_HAS(err(), "tensor 'a': shape [-1] must hold non-negative integers");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4);
  EXPECT_HAS(err(), "tensor 'a': data_offsets [4, 0] end before they begin");

  // A non-float tensor opens (a buffer a model may ignore) but is not readable as floats.
  write_raw(p, R"({"pos": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  SafetensorsReader r(p.string());
  std::vector<float> v(2);
  EXPECT_HAS(error_of([&] { r.read_f32("pos", v); }), "tensor 'pos' has dtype I64; only F32, F16 and BF16");
  EXPECT_HAS(error_of([&] { r.read_f32("nope", v); }), "no tensor 'nope'");
}

// Hostile headers: nesting, huge values and repeated names give a short error naming the file
// (a 200k-deep header used to overflow the stack, a 50 MB value to fill the error line).
TEST(Safetensors, HostileHeadersGiveShortErrors) {
  TempDir d("ds_st");
  const fs::path p = d.path / "bad.safetensors";
  auto err = [&] { return error_of([&] { SafetensorsFile f(p.string()); }); };

  const std::size_t deep = 200'000;
  write_raw(p, R"({"t": )" + std::string(deep, '[') + std::string(deep, ']') + "}", 0);
  EXPECT_HAS(err(), p.string() + ": the header nests deeper than 32 levels");
  std::string objects;
  for (std::size_t i = 0; i < deep; ++i) objects += R"({"a":)";
  write_raw(p, objects + "1" + std::string(deep, '}'), 0);
  EXPECT_HAS(err(), "the header nests deeper than 32 levels");

  const std::string huge(50u << 20, 'x');
  write_raw(p, R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": ")" + huge + R"("}})", 4);
  std::string e = err();
  EXPECT_HAS(e, R"(tensor 't': "data_offsets" must be [begin, end] (non-negative integers), got "xxx)");
  EXPECT_HAS(e, "... (52428802 bytes)");
  EXPECT_LT(e.size(), 400u) << e.substr(0, 400);
  write_raw(p, R"({")" + huge + R"(": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}})", 4);
  e = err();
  EXPECT_HAS(e, "xxx... (52428800 bytes)': unknown dtype \"Q7\"");
  EXPECT_LT(e.size(), 400u) << e.substr(0, 400);
  // A valid shape of 100000 dimensions of 1 is echoed cut.
  const std::string many = shape_text(std::vector<std::int64_t>(100'000, 1));
  EXPECT_HAS(many, "[1, 1, 1, ");
  EXPECT_HAS(many, ", ... (100000 dimensions)]");
  EXPECT_LT(many.size(), 120u);

  // A tensor named twice: nlohmann alone keeps the last entry (or reports a gap in the data).
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
               R"("w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  EXPECT_HAS(err(), p.string() + ": the header has the key 'w' twice");
  EXPECT_HAS(err(), "twice (line 1, column 63)");  // the strict reader says where
  write_raw(p, R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_HAS(err(), "the header has the key 'dtype' twice in one object");

  // The same rules for a sharded directory's index.
  SafetensorsWriter w((d.path / "a.safetensors").string(), {{"x", DType::F32, {1}}}, {});
  w.write(std::vector<float>{1.0f});
  w.close();
  std::ofstream(d.path / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "a.safetensors", "x": "a.safetensors"}})";
  EXPECT_HAS(error_of([&] { SafetensorsReader r(d.path.string()); }),
             "model.safetensors.index.json: the index has the key 'x' twice in one object");
}

// --- Hugging Face GPT-2 names -------------------------------------------------------------

namespace {

// Our GPT parameter list for n_layer 1, C = 4, V = 5, T = 3 (as ds::nn::Gpt registers it).
std::vector<ParamInfo> tiny_gpt(std::int64_t T = 3) {
  const std::int64_t C = 4, V = 5;
  std::vector<ParamInfo> p = {{"wte.weight", {V, C}}, {"wpe.weight", {T, C}}};
  const std::string h = "h.0.";
  p.push_back({h + "ln_1.weight", {C}});
  p.push_back({h + "ln_1.bias", {C}});
  p.push_back({h + "attn.c_attn.weight", {3 * C, C}});
  p.push_back({h + "attn.c_attn.bias", {3 * C}});
  p.push_back({h + "attn.c_proj.weight", {C, C}});
  p.push_back({h + "attn.c_proj.bias", {C}});
  p.push_back({h + "ln_2.weight", {C}});
  p.push_back({h + "ln_2.bias", {C}});
  p.push_back({h + "mlp.c_fc.weight", {4 * C, C}});
  p.push_back({h + "mlp.c_fc.bias", {4 * C}});
  p.push_back({h + "mlp.c_proj.weight", {C, 4 * C}});
  p.push_back({h + "mlp.c_proj.bias", {C}});
  p.push_back({"ln_f.weight", {C}});
  p.push_back({"ln_f.bias", {C}});
  return p;
}

struct Extra { std::string name; std::vector<std::int64_t> shape; };

// Writes the HF GPT-2 form of `params` (values: 100 * index + element), with `prefix`, plus
// extra tensors (values 0) and, when lm_head is set, a tied lm_head.weight copy of wte.
void write_hf(const fs::path& p, const std::vector<ParamInfo>& params, const std::string& prefix,
              const std::vector<Extra>& extra, bool lm_head, float lm_head_delta = 0.0f, std::int64_t wpe_rows = 0) {
  auto hf = hf::to_hf(hf::gpt2(), params);
  std::vector<SafetensorsSpec> specs;
  std::vector<std::vector<float>> vals;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto shape = hf[i].shape;
    if (hf[i].name == "wpe.weight" && wpe_rows) shape[0] = wpe_rows;
    std::size_t n = 1;
    for (auto s : shape) n *= std::size_t(s);
    std::vector<float> v(n);
    for (std::size_t k = 0; k < n; ++k) v[k] = float(100 * i + k);
    specs.push_back({prefix + hf[i].name, DType::F32, shape});
    vals.push_back(v);
  }
  if (lm_head) {
    specs.push_back({"lm_head.weight", DType::F32, hf[0].shape});
    vals.push_back(vals[0]);
    vals.back()[1] += lm_head_delta;
  }
  for (const auto& e : extra) {
    std::size_t n = 1;
    for (auto s : e.shape) n *= std::size_t(s);
    specs.push_back({prefix + e.name, DType::F32, e.shape});
    vals.emplace_back(n, 0.0f);
  }
  SafetensorsWriter w(p.string(), specs, {{"format", "pt"}});
  for (const auto& v : vals) w.write(v);
  w.close();
}

std::vector<std::vector<float>> load_all(const std::string& path, const std::vector<ParamInfo>& params,
                                         hf::LoadPlan* plan_out = nullptr) {
  SafetensorsReader r(path);
  auto plan = hf::plan_load(r, params);
  std::vector<std::vector<float>> out;
  std::vector<std::span<float>> spans;
  for (const auto& p : params) out.emplace_back(p.numel());
  for (auto& o : out) spans.emplace_back(o);
  hf::load(r, plan, params, spans);
  if (plan_out) *plan_out = plan;
  return out;
}

}  // namespace

TEST(HfGpt2, LoadsTransposedPrefixedWithBuffersAndTiedHead) {
  TempDir d("ds_hf");
  const auto params = tiny_gpt();
  const fs::path p = d.path / "gpt2.safetensors";
  write_hf(p, params, "transformer.", {{"h.0.attn.bias", {1, 1, 3, 3}}, {"h.0.attn.masked_bias", {}}}, true, 0.0f,
           /*wpe_rows=*/8);
  hf::LoadPlan plan;
  const auto w = load_all(p.string(), params, &plan);
  EXPECT_EQ(plan.naming, "Hugging Face gpt2 names");
  EXPECT_EQ(plan.ignored, 2u);
  EXPECT_EQ(plan.tied.size(), 1u);
  // c_attn (index 4): ours [12, 4] row r col c = theirs [4, 12] row c col r = 400 + c * 12 + r.
  EXPECT_EQ(w[4][1 * 4 + 2], 400.0f + 2 * 12 + 1);
  // wpe cropped: the first 3 of 8 rows.
  EXPECT_EQ(w[1].size(), 12u);
  EXPECT_EQ(w[1][11], 100.0f + 11);
  EXPECT_EQ(w[0][3], 3.0f);  // wte as is
}

TEST(HfGpt2, ErrorsNameTheTensorAndShapes) {
  TempDir d("ds_hf");
  const auto params = tiny_gpt();
  const std::string p = (d.path / "g.safetensors").string();
  auto err = [&](const std::vector<ParamInfo>& model) { return error_of([&] { load_all(p, model); }); };

  // A file of 2 layers into a 1-layer model: the extra layer is named.
  auto two = tiny_gpt();
  for (auto& q : tiny_gpt())
    if (q.name.rfind("h.0.", 0) == 0) two.push_back({"h.1." + q.name.substr(4), q.shape});
  write_hf(p, two, "", {}, false);
  EXPECT_HAS(err(params), "tensor 'h.1.attn.c_attn.bias' [12] is not a parameter of this model (gpt2): the file's model has more layers");
  // A 2-layer model from a 1-layer file: the missing tensor and the parameter it would fill.
  write_hf(p, params, "", {}, false);
  EXPECT_HAS(err(two), "no tensor 'h.1.ln_1.weight' (or with a 'transformer.' prefix) for the model's parameter 'h.1.ln_1.weight' [4]");
  // Another width: the shape in Conv1D layout.
  auto odd = params;
  odd[4].shape = {12, 5};
  EXPECT_HAS(err(odd), "tensor 'h.0.attn.c_attn.weight' has shape [4, 12], the model needs [5, 12] (Conv1D layout "
                       "[in, out] of its parameter 'h.0.attn.c_attn.weight' [12, 5])");
}

TEST(HfGpt2, UntiedHeadAndUnknownTensorsRefused) {
  TempDir d("ds_hf");
  const auto params = tiny_gpt();
  const std::string p = (d.path / "g.safetensors").string();
  write_hf(p, params, "", {}, true, 1.0f);
  EXPECT_HAS(error_of([&] { load_all(p, params); }), "tensor 'lm_head.weight' differs from 'wte.weight'");
  write_hf(p, params, "", {{"score.weight", {2, 4}}}, false);
  EXPECT_HAS(error_of([&] { load_all(p, params); }), "tensor 'score.weight' [2, 4] is not a parameter of this model");
}

TEST(HfGpt2, DstrainLayoutFromMetadata) {
  // ds_to_fp32 without --hf_names: our names and layouts, told apart by the metadata (the
  // square c_proj weights look the same either way).
  TempDir d("ds_hf");
  const auto params = tiny_gpt();
  const std::string p = (d.path / "ours.safetensors").string();
  {
    std::vector<SafetensorsSpec> specs;
    for (const auto& q : params) specs.push_back({q.name, DType::F32, q.shape});
    SafetensorsWriter w(p, specs, {{"producer", "dstrain ds_to_fp32"}, {"layout", "dstrain"}});
    for (std::size_t i = 0; i < params.size(); ++i) w.write(iota(params[i].numel(), float(i)));
    w.close();
  }
  hf::LoadPlan plan;
  const auto w = load_all(p, params, &plan);
  EXPECT_EQ(plan.naming, "dstrain names");
  EXPECT_EQ(w[6], iota(16, 6.0f));  // attn.c_proj as written, not transposed
  auto other = params;
  other[1].shape = {4, 4};
  EXPECT_HAS(error_of([&] { load_all(p, other); }), "tensor 'wpe.weight' has shape [3, 4], the model needs [4, 4]");
}

TEST(HfGpt2, ToHfAndTranspose) {
  const auto hf = hf::to_hf(hf::gpt2(), tiny_gpt());
  EXPECT_EQ(hf[12].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(hf[12].shape, (std::vector<std::int64_t>{16, 4}));
  EXPECT_TRUE(hf[12].transpose);
  EXPECT_FALSE(hf[13].transpose);
  EXPECT_EQ(hf::detect(tiny_gpt()), &hf::gpt2());
  EXPECT_EQ(hf::detect(std::vector<ParamInfo>{{"fc1.weight", {2, 2}}}), nullptr);
  EXPECT_HAS(error_of([] { hf::to_hf(hf::gpt2(), std::vector<ParamInfo>{{"h.01.ln_1.weight", {2}}}); }),
             "parameter 'h.01.ln_1.weight' has no Hugging Face gpt2 name");
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // 2 x 3
  std::vector<float> t(6);
  hf::transpose(a.data(), t.data(), 3, 2);  // out 3 x 2
  EXPECT_EQ(t, (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

// --- Hugging Face Llama names (ours already; the table accounts for buffers and ties) -----

namespace {

std::vector<ParamInfo> tiny_llama(bool tied) {
  const std::string p = "model.layers.0.";
  std::vector<ParamInfo> v = {{"model.embed_tokens.weight", {5, 4}},  {p + "self_attn.q_proj.weight", {4, 4}},
                              {p + "self_attn.k_proj.weight", {2, 4}}, {p + "self_attn.v_proj.weight", {2, 4}},
                              {p + "self_attn.o_proj.weight", {4, 4}}, {p + "mlp.gate_proj.weight", {6, 4}},
                              {p + "mlp.up_proj.weight", {6, 4}},      {p + "mlp.down_proj.weight", {4, 6}},
                              {p + "input_layernorm.weight", {4}},     {p + "post_attention_layernorm.weight", {4}},
                              {"model.norm.weight", {4}}};
  if (!tied) v.push_back({"lm_head.weight", {5, 4}});
  return v;
}

// The file as transformers writes it: every parameter (value 10 * index + element), the
// rotary buffer, and lm_head.weight (a copy of the embedding when `tied`).
void write_llama(const fs::path& path, bool tied) {
  const auto params = tiny_llama(false);
  std::vector<SafetensorsSpec> specs;
  std::vector<std::vector<float>> vals;
  for (std::size_t i = 0; i < params.size(); ++i) {
    specs.push_back({params[i].name, DType::BF16, params[i].shape});
    vals.push_back(iota(params[i].numel(), float(10 * (tied && i + 1 == params.size() ? 0 : i))));
  }
  specs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {1}});
  vals.push_back({1.0f});
  SafetensorsWriter w(path.string(), specs, {{"format", "pt"}});
  for (const auto& v : vals) w.write(v);
  w.close();
}

}  // namespace

TEST(HfLlama, LoadsByNameSkippingRotaryBufferAndTiedHead) {
  TempDir d("ds_hf");
  const fs::path p = d.path / "llama.safetensors";
  write_llama(p, false);
  hf::LoadPlan plan;
  auto w = load_all(p.string(), tiny_llama(false), &plan);
  EXPECT_EQ(plan.naming, "Hugging Face llama names");
  EXPECT_EQ(plan.ignored, 1u);
  EXPECT_EQ(w[5], iota(24, 50.0f));  // gate_proj as stored (bf16-exact values), not transposed
  EXPECT_EQ(hf::detect(tiny_llama(true)), &hf::llama());

  // A tied model takes a file whose lm_head equals the embedding, and refuses one where it differs.
  write_llama(p, true);
  w = load_all(p.string(), tiny_llama(true), &plan);
  EXPECT_EQ(plan.tied.size(), 1u);
  write_llama(p, false);
  EXPECT_HAS(error_of([&] { load_all(p.string(), tiny_llama(true)); }),
             "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'");
  // A parameter the file lacks is named.
  auto extra = tiny_llama(false);
  extra.push_back({"model.layers.1.input_layernorm.weight", {4}});
  EXPECT_HAS(error_of([&] { load_all(p.string(), extra); }),
             "no tensor 'model.layers.1.input_layernorm.weight' for the model's parameter");
}
