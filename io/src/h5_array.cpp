#include "ds/io/h5_array.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/file_read.h"
#include "h5_check.h"
#include "h5_hid.h"

namespace ds::io {

namespace {

std::string integer_name(std::size_t bytes, bool is_signed) {
  return (is_signed ? "int" : "uint") + std::to_string(bytes * 8);
}

// NumPy's name for a numeric type; the HDF5 class for the rest (what the user must change).
std::string type_name(hid_t type, H5T_class_t cls, const std::string& where) {
  const std::size_t bytes = H5Tget_size(type);  // 0 only for an invalid id, which H5Dget_type did not return
  switch (cls) {
    case H5T_FLOAT: return "float" + std::to_string(bytes * 8);
    case H5T_INTEGER: return integer_name(bytes, DS_H5_CHECK(H5Tget_sign(type), where) == H5T_SGN_2);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum (h5py writes bool arrays as one)";
    case H5T_OPAQUE: return "opaque";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length";
    case H5T_REFERENCE: return "reference";
    case H5T_BITFIELD: return "bitfield";
    default: return "HDF5 type class " + std::to_string(int(cls));
  }
}

// An open dataset of rank >= 1 and its extent.
struct OpenArray {
  Hid dset, space;
  std::vector<hsize_t> dims;
  std::size_t row_numel = 1;  // elements per row: the product of dims after the first
  std::string where;          // "file F dataset D" for errors

  // Rows in any order, repeats allowed, into dst in that order, converted to mem_type by HDF5.
  // One HDF5 read for all of them
  // (an H5Dread with conversion costs tens of microseconds, a row of a few KiB far less): a
  // selection of the runs of consecutive distinct rows, which HDF5 returns in file order,
  // then each row copied to its place.
  void read_rows(std::span<const std::size_t> rows, hid_t mem_type, std::size_t elem_bytes, void* dst) const {
    if (rows.empty() || row_numel == 0) return;
    std::vector<std::size_t> distinct(rows.begin(), rows.end());
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    DS_CHECK(distinct.back() < dims[0],
             "HDF5 " << where << ": row " << distinct.back() << " beyond its " << dims[0] << " rows");
    std::vector<hsize_t> start(dims.size(), 0), cnt = dims;
    for (std::size_t i = 0, j = 0; i < distinct.size(); i = j) {
      for (j = i + 1; j < distinct.size() && distinct[j] == distinct[j - 1] + 1;) ++j;
      start[0] = distinct[i];
      cnt[0] = j - i;
      DS_H5_CHECK(H5Sselect_hyperslab(space.get(), i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                                      cnt.data(), nullptr),
                  where);
    }
    const bool in_order = distinct.size() == rows.size() && std::is_sorted(rows.begin(), rows.end());
    const std::size_t row_bytes = row_numel * elem_bytes;
    std::vector<char> file_order(in_order ? 0 : distinct.size() * row_bytes);
    const hsize_t numel = distinct.size() * row_numel;
    Hid mspace(DS_H5_CHECK(H5Screate_simple(1, &numel, nullptr), where), H5Sclose);
    DS_H5_CHECK(H5Dread(dset.get(), mem_type, mspace.get(), space.get(), H5P_DEFAULT, in_order ? dst : file_order.data()),
                where << " (" << rows.size() << " rows)");
    if (in_order) return;
    auto* out = static_cast<char*>(dst);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto at = std::size_t(std::lower_bound(distinct.begin(), distinct.end(), rows[i]) - distinct.begin());
      std::memcpy(out + i * row_bytes, file_order.data() + at * row_bytes, row_bytes);
    }
  }
};

OpenArray open_array(hid_t file, const std::string& path, std::string_view name) {
  const std::string n(name);
  OpenArray a;
  a.where = "file " + path + " dataset " + n;
  a.dset = Hid(DS_H5_CHECK(H5Dopen2(file, n.c_str(), H5P_DEFAULT), a.where), H5Dclose);
  a.space = Hid(DS_H5_CHECK(H5Dget_space(a.dset.get()), a.where), H5Sclose);
  const int nd = DS_H5_CHECK(H5Sget_simple_extent_ndims(a.space.get()), a.where);
  DS_CHECK(nd >= 1, "HDF5 " << a.where << " is a scalar, not an array of rows");
  a.dims.resize(std::size_t(nd));
  DS_H5_CHECK(H5Sget_simple_extent_dims(a.space.get(), a.dims.data(), nullptr), a.where);
  for (std::size_t d = 1; d < a.dims.size(); ++d) a.row_numel *= std::size_t(a.dims[d]);
  return a;
}

}  // namespace

H5ArrayFile::H5ArrayFile(const std::string& path) : path_(path) {
  detail::silence_hdf5_errors();
  check_regular_file(path, "HDF5 file");  // a FIFO would block H5Fopen; a directory reads as corrupt
  id_ = DS_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "file " << path);
}

H5ArrayFile::~H5ArrayFile() {
  if (id_ >= 0) {
    H5Fclose(id_);
    H5Eclear2(H5E_DEFAULT);
  }
}

H5ArrayFile::H5ArrayFile(H5ArrayFile&& o) noexcept : id_(o.id_), path_(std::move(o.path_)) { o.id_ = -1; }

bool H5ArrayFile::is_dataset(std::string_view name) const {
  const std::string n(name);
  if (!link_path_exists(id_, n)) return false;
  Hid obj(DS_H5_CHECK(H5Oopen(id_, n.c_str(), H5P_DEFAULT), "file " << path_ << " object " << n), H5Oclose);
  return DS_H5_CHECK(H5Iget_type(obj.get()), "file " << path_ << " object " << n) == H5I_DATASET;
}

ArrayInfo H5ArrayFile::info(std::string_view name) const {
  const std::string n(name);
  Hid dset(DS_H5_CHECK(H5Dopen2(id_, n.c_str(), H5P_DEFAULT), "file " << path_ << " dataset " << n), H5Dclose);
  Hid space(DS_H5_CHECK(H5Dget_space(dset.get()), "file " << path_ << " dataset " << n), H5Sclose);
  Hid type(DS_H5_CHECK(H5Dget_type(dset.get()), "file " << path_ << " dataset " << n), H5Tclose);
  const int nd = DS_H5_CHECK(H5Sget_simple_extent_ndims(space.get()), "file " << path_ << " dataset " << n);
  std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
  if (nd > 0) DS_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "file " << path_ << " dataset " << n);
  const H5T_class_t cls = DS_H5_CHECK(H5Tget_class(type.get()), "file " << path_ << " dataset " << n);
  ArrayInfo out;
  out.kind = cls == H5T_FLOAT ? ElementKind::Float : cls == H5T_INTEGER ? ElementKind::Integer : ElementKind::Other;
  out.type_name = type_name(type.get(), cls, "file " + path_ + " dataset " + n);
  out.shape.assign(dims.begin(), dims.end());
  return out;
}

void H5ArrayFile::read_rows(std::string_view name, std::span<const std::size_t> rows, float* dst) const {
  open_array(id_, path_, name).read_rows(rows, H5T_NATIVE_FLOAT, sizeof(float), dst);
}

void H5ArrayFile::read_rows(std::string_view name, std::span<const std::size_t> rows, std::int32_t* dst) const {
  open_array(id_, path_, name).read_rows(rows, H5T_NATIVE_INT32, sizeof(std::int32_t), dst);
}

void H5ArrayFile::read_row_range(std::string_view name, std::size_t first, std::size_t count,
                                 std::int32_t* dst) const {
  std::vector<std::size_t> rows(count);
  std::iota(rows.begin(), rows.end(), first);  // sorted and distinct: read straight into dst
  open_array(id_, path_, name).read_rows(rows, H5T_NATIVE_INT32, sizeof(std::int32_t), dst);
}

}  // namespace ds::io
