// Hid: one HDF5 identifier, closed by its H5?close when it goes (private to ds_io, as HDF5 is).
#pragma once

#include <hdf5.h>

#include <string>

namespace ds::io {

// Owns one hid_t and closes it with the matching H5?close.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer c) : id_(id), close_(c) {}
  ~Hid() { reset(); }
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept { reset(); id_ = o.id_; close_ = o.close_; o.id_ = -1; return *this; }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  hid_t get() const { return id_; }
  void reset() { if (id_ >= 0 && close_) close_(id_); id_ = -1; }
 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Whether every link along `path` ("a/b/c") exists under `loc` ("" and "/" do): H5Lexists
// fails, rather than saying no, when an intermediate group is missing.
inline bool link_path_exists(hid_t loc, const std::string& path) {
  if (path == "/" || path.empty()) return true;
  std::size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (!prefix.empty() && prefix != "/") {
      const htri_t e = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
      if (e <= 0) { H5Eclear2(H5E_DEFAULT); return false; }
    }
    if (pos == std::string::npos) return true;
  }
}

}  // namespace ds::io
