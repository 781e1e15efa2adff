// safetensors reading: header checks as the reference implementation makes them, streamed
// reads with conversion to fp32, and Hugging Face's sharded directories.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ds/core/error.h"
#include "ds/core/excerpt.h"
#include "ds/core/file_read.h"
#include "ds/core/half.h"
#include "ds/core/json.h"
#include "ds/io/safetensors.h"

namespace ds::io {

namespace fs = std::filesystem;

namespace {

// The reference implementation's cap: a header larger than this is refused unread.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// A header nests 3 levels (header, entry, shape); deeper input is refused while parsing, so
// nothing later (dump, destruction) recurses through a hostile 100 MB of brackets.
constexpr int kMaxJsonDepth = 32;

// Every dtype the format defines, with its element size; F32/F16/BF16 are readable as fp32.
struct DtypeRow { const char* name; std::uint64_t size; std::optional<DType> dt; };
constexpr DtypeRow kDtypes[] = {
    {"F32", 4, DType::F32}, {"F16", 2, DType::F16}, {"BF16", 2, DType::BF16}, {"F64", 8, std::nullopt},
    {"I64", 8, std::nullopt}, {"U64", 8, std::nullopt}, {"I32", 4, std::nullopt}, {"U32", 4, std::nullopt},
    {"I16", 2, std::nullopt}, {"U16", 2, std::nullopt}, {"I8", 1, std::nullopt}, {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt}};

// A JSON value for a message: bounded, so a 50 MB value cannot become a 50 MB error line.
std::string json_excerpt(const nlohmann::json& v) {
  return excerpt(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Parses a header or index with the strict JSON reader (JSON alone): nesting deeper than
// kMaxJsonDepth and a key repeated in one object are errors (nlohmann alone keeps the last of
// duplicates, so a second tensor of the same name would silently replace the first).
nlohmann::json parse_checked_json(const std::string& text, const std::string& path, const std::string& what) {
  try {
    return to_nlohmann(parse_json(text, path, kMaxJsonDepth, JsonSyntax::Strict));
  } catch (const JsonError& e) {
    const std::string at = " (line " + std::to_string(e.pos.line) + ", column " + std::to_string(e.pos.column) + ")";
    if (e.kind == JsonError::Kind::TooDeep)
      DS_THROW(path << ": " << what << " nests deeper than " << kMaxJsonDepth << " levels (not a safetensors "
                    << what << ")" << at);
    if (e.kind == JsonError::Kind::DuplicateKey)
      DS_THROW(path << ": " << what << " has the key '" << excerpt(e.key) << "' twice"
                    << (e.in_root ? std::string() : " in one object") << at);
    DS_THROW(path << ": " << what << " is not valid JSON (" << excerpt(e.reason, 200) << at << ")");
  }
}

void pread_all(int fd, void* buf, std::uint64_t bytes, std::uint64_t offset, const std::string& path,
               const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, std::min<std::uint64_t>(bytes, 1u << 30), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    DS_CHECK(got > 0, path << ": reading " << what << " failed: "
                           << (got < 0 ? std::strerror(errno) : "unexpected end of file"));
    p += got;
    bytes -= std::uint64_t(got);
    offset += std::uint64_t(got);
  }
}

SafetensorsTensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e) {
  const std::string where = path + ": tensor '" + excerpt(name) + "'";
  DS_CHECK(e.is_object(), where << " must be an object {dtype, shape, data_offsets}, got " << json_excerpt(e));
  SafetensorsTensor t;
  t.name = name;
  t.file = path;
  DS_CHECK(e.contains("dtype") && e["dtype"].is_string(), where << ": \"dtype\" missing or not a string");
  t.dtype = e["dtype"].get<std::string>();
  const DtypeRow* row = nullptr;
  for (const auto& r : kDtypes)
    if (t.dtype == r.name) row = &r;
  DS_CHECK(row, where << ": unknown dtype \"" << excerpt(t.dtype) << "\"");
  t.float_dtype = row->dt;
  DS_CHECK(e.contains("shape") && e["shape"].is_array(), where << ": \"shape\" missing or not an array");
  std::uint64_t numel = 1;
  for (const auto& d : e["shape"]) {
    DS_CHECK(d.is_number_unsigned(), where << ": shape " << json_excerpt(e["shape"]) << " must hold non-negative integers");
    const auto v = d.get<std::uint64_t>();
    DS_CHECK(v <= std::uint64_t(std::numeric_limits<std::int64_t>::max()) &&
                 (v == 0 || numel <= std::numeric_limits<std::uint64_t>::max() / v / row->size),
             where << ": shape " << json_excerpt(e["shape"]) << " is too large");
    numel *= v;
    t.shape.push_back(std::int64_t(v));
  }
  const auto& off = e.contains("data_offsets") ? e["data_offsets"] : nlohmann::json();
  DS_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
           where << ": \"data_offsets\" must be [begin, end] (non-negative integers), got " << json_excerpt(off));
  t.begin = off[0].get<std::uint64_t>();
  t.end = off[1].get<std::uint64_t>();
  DS_CHECK(t.begin <= t.end, where << ": data_offsets [" << t.begin << ", " << t.end << "] end before they begin");
  DS_CHECK(t.end - t.begin == numel * row->size,
           where << ": shape " << shape_text(t.shape) << " of " << t.dtype << " needs " << numel * row->size
                 << " bytes but data_offsets [" << t.begin << ", " << t.end << "] hold " << t.end - t.begin);
  return t;
}

}  // namespace

std::string shape_text(std::span<const std::int64_t> shape) {
  std::ostringstream os;
  os << '[';
  std::size_t i = 0;
  for (; i < shape.size() && os.tellp() < std::streamoff(kExcerptBytes); ++i) os << (i ? ", " : "") << shape[i];
  if (i < shape.size()) os << ", ... (" << shape.size() << " dimensions)";
  os << ']';
  return os.str();
}

std::size_t SafetensorsTensor::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = open_regular_file(path, "safetensors file");
  try {
    struct stat st {};
    DS_CHECK(::fstat(fd_, &st) == 0, path << ": fstat failed: " << std::strerror(errno));
    const auto size = std::uint64_t(st.st_size);
    DS_CHECK(size >= 8, path << ": not a safetensors file: " << size << " bytes, shorter than the 8-byte header length");
    unsigned char len[8];
    pread_all(fd_, len, 8, 0, path, "the header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    DS_CHECK(n <= kMaxHeaderBytes, path << ": bad header length " << n << " (over the format's cap of "
                                        << kMaxHeaderBytes << " bytes; not a safetensors file?)");
    DS_CHECK(n <= size - 8, path << ": bad header length " << n << ": the file holds only " << size - 8
                                 << " bytes after it (truncated, or not a safetensors file)");
    std::string text(n, '\0');
    pread_all(fd_, text.data(), n, 8, path, "the header");
    data_start_ = 8 + n;
    const nlohmann::json h = parse_checked_json(text, path, "the header");
    text = std::string();  // the parsed copy is enough
    DS_CHECK(h.is_object(), path << ": the header must be a JSON object, got " << h.type_name());
    for (const auto& [key, value] : h.items()) {
      if (key == "__metadata__") {
        DS_CHECK(value.is_object(), path << ": \"__metadata__\" must be an object of strings");
        for (const auto& [k, v] : value.items()) {
          DS_CHECK(v.is_string(), path << ": __metadata__." << excerpt(k) << " must be a string, got " << json_excerpt(v));
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      tensors_.push_back(parse_entry(path, key, value));
    }
    // The ranges must tile the data section: sorted by begin, each starts where the last ended.
    std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t at = 0;
    const SafetensorsTensor* prev = nullptr;
    for (const auto& t : tensors_) {
      DS_CHECK(t.begin >= at, path << ": tensor '" << excerpt(t.name) << "' data_offsets [" << t.begin << ", " << t.end
                                   << "] overlap tensor '" << excerpt(prev->name) << "' [" << prev->begin << ", " << prev->end << "]");
      DS_CHECK(t.begin == at, path << ": tensor '" << excerpt(t.name) << "' data_offsets [" << t.begin << ", " << t.end
                                   << "] leave a gap after byte " << at << " of the data section");
      at = t.end;
      prev = &t;
    }
    const std::uint64_t data_bytes = size - data_start_;
    DS_CHECK(at <= data_bytes, path << ": tensor '" << (prev ? excerpt(prev->name) : std::string()) << "' data_offsets end at byte "
                                    << at << " but the file's data section holds " << data_bytes
                                    << " bytes (truncated file?)");
    DS_CHECK(at == data_bytes, path << ": the data section holds " << data_bytes << " bytes but the tensors cover "
                                    << at << " (trailing bytes)");
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_f32(const SafetensorsTensor& t, std::span<float> out) const {
  DS_CHECK(t.float_dtype, path_ << ": tensor '" << excerpt(t.name) << "' has dtype " << t.dtype
                                << "; only F32, F16 and BF16 tensors can be read as floats");
  DS_CHECK(out.size() == t.numel(), path_ << ": tensor '" << excerpt(t.name) << "' has " << t.numel()
                                          << " elements, the destination " << out.size());
  const std::string what = "tensor '" + excerpt(t.name) + "'";
  if (*t.float_dtype == DType::F32) {
    pread_all(fd_, out.data(), out.size_bytes(), data_start_ + t.begin, path_, what);
    return;
  }
  // Half types: a bounded chunk at a time, converted in place into the destination.
  constexpr std::size_t kChunk = std::size_t(1) << 20;
  std::vector<std::uint16_t> buf(std::min(kChunk, out.size()));
  for (std::size_t i = 0; i < out.size(); i += kChunk) {
    const std::size_t n = std::min(kChunk, out.size() - i);
    pread_all(fd_, buf.data(), n * 2, data_start_ + t.begin + i * 2, path_, what);
    convert(buf.data(), *t.float_dtype, out.data() + i, DType::F32, n);
  }
}

// ---------------------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  DS_CHECK(fs::exists(path, ec), path << " does not exist");
  std::vector<std::string> shard_files;
  nlohmann::json weight_map;
  const fs::path dir(path);
  if (fs::is_directory(path, ec)) {
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index, ec)) {
      const std::string text = read_regular_file(index.string(), "safetensors index");
      const nlohmann::json j = parse_checked_json(text, index.string(), "the index");
      DS_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               index.string() << ": no \"weight_map\" object ({\"weight_map\": {tensor: file}})");
      weight_map = j["weight_map"];
      for (const auto& [name, file] : weight_map.items()) {
        DS_CHECK(file.is_string(), index.string() << ": weight_map." << excerpt(name) << " must be a file name, got "
                                                  << json_excerpt(file));
        const std::string f = file.get<std::string>();
        // Shards sit beside the index: a path that leaves the directory is refused.
        DS_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
                 index.string() << ": weight_map." << excerpt(name) << " names \"" << excerpt(f) << "\", not a file in "
                                << path);
        if (std::find(shard_files.begin(), shard_files.end(), f) == shard_files.end()) shard_files.push_back(f);
      }
      DS_CHECK(!shard_files.empty(), index.string() << ": the weight_map is empty");
    } else {
      const fs::path single = dir / "model.safetensors";
      DS_CHECK(fs::exists(single, ec), path << " holds neither model.safetensors.index.json nor model.safetensors");
      shard_files.push_back("model.safetensors");
    }
    for (const auto& f : shard_files) files_.push_back(std::make_unique<SafetensorsFile>((dir / f).string()));
  } else {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  }
  for (const auto& f : files_) {
    for (const auto& t : f->tensors()) {
      auto [it, fresh] = by_name_.emplace(t.name, std::make_pair(f.get(), &t));
      DS_CHECK(fresh, path << ": tensor '" << excerpt(t.name) << "' is in both " << it->second.first->path() << " and " << f->path());
    }
  }
  if (!weight_map.is_null()) {
    for (const auto& [name, file] : weight_map.items()) {
      auto it = by_name_.find(name);
      const std::string want = (dir / file.get<std::string>()).string();
      DS_CHECK(it != by_name_.end() && it->second.first->path() == want,
               path << ": the index puts tensor '" << excerpt(name) << "' in " << excerpt(file.get<std::string>()) << ", "
                    << (it == by_name_.end() ? std::string("which does not hold it") : "but it is in " + it->second.first->path()));
    }
  }
}

SafetensorsReader::~SafetensorsReader() = default;

std::vector<const SafetensorsTensor*> SafetensorsReader::tensors() const {
  std::vector<const SafetensorsTensor*> out;
  for (const auto& [name, ft] : by_name_) out.push_back(ft.second);
  return out;
}

const SafetensorsTensor* SafetensorsReader::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.second;
}

void SafetensorsReader::read_f32(std::string_view name, std::span<float> out) const {
  auto it = by_name_.find(name);
  DS_CHECK(it != by_name_.end(), path_ << ": no tensor '" << name << "'");
  it->second.first->read_f32(*it->second.second, out);
}

}  // namespace ds::io
