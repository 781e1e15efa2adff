#include "ds/io/h5file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "ds/core/file_read.h"
#include "h5_check.h"
#include "h5_hid.h"

namespace ds::io {

namespace detail {

void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* e, void* client) {
  auto* out = static_cast<std::string*>(client);
  if (n > 2) return 0;  // the innermost few frames say what went wrong
  if (!out->empty()) out->append(" <- ");
  out->append(e->func_name ? e->func_name : "?");
  out->append(": ");
  out->append(e->desc ? e->desc : "");
  return 0;
}
}  // namespace

std::string hdf5_error_summary() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? std::string("no HDF5 error details") : s;
}

void throw_h5_error(const char* call, const std::string& context, const char* file, int line) {
  std::string call_name(call);
  if (auto p = call_name.find('('); p != std::string::npos) call_name = call_name.substr(0, p);
  std::ostringstream os;
  os << "HDF5 call " << call_name << " failed on " << context << ": " << hdf5_error_summary();
  ::ds::throw_error(os.str(), file, line);
}

}  // namespace detail

namespace {

hid_t make_f16_type() {
  // IEEE binary16 as h5py builds it: numpy float16 reads it natively.
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

// Type for dtype (file and memory types coincide on little-endian hosts).
Hid type_of(DType t) {
  switch (t) {
    case DType::F32: return Hid(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case DType::F64: return Hid(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case DType::I64: return Hid(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case DType::I32: return Hid(H5Tcopy(H5T_STD_I32LE), H5Tclose);
    case DType::U8: return Hid(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    case DType::BF16: return Hid(H5Tcopy(H5T_STD_U16LE), H5Tclose);
    case DType::F16: return Hid(make_f16_type(), H5Tclose);
  }
  DS_THROW("HDF5: unsupported dtype " << dtype_name(t));
}

Hid vlen_string_type() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return Hid(t, H5Tclose);
}

Hid bool_type() {
  // h5py's bool: an int8 enum {FALSE = 0, TRUE = 1}, read back as numpy.bool_.
  hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
  std::int8_t v = 0;
  H5Tenum_insert(t, "FALSE", &v);
  v = 1;
  H5Tenum_insert(t, "TRUE", &v);
  return Hid(t, H5Tclose);
}

std::string str(std::string_view s) { return std::string(s); }

Hid lcpl_intermediate() {
  hid_t p = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(p, 1);
  return Hid(p, H5Pclose);
}

// Names of map keys inside HDF5: '%' and '/' are percent-escaped; "" and "." get a "%."
// prefix (HDF5 names cannot be empty, contain '/', or be ".").
std::string escape_key(const std::string& k) {
  std::string o;
  for (char c : k) {
    if (c == '%') o += "%25";
    else if (c == '/') o += "%2F";
    else o += c;
  }
  if (o.empty() || o == ".") o = "%." + o;
  return o;
}

std::string unescape_key(const std::string& n) {
  std::string s = n.rfind("%.", 0) == 0 ? n.substr(2) : n;
  std::string o;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && s.compare(i, 3, "%25") == 0) { o += '%'; i += 2; }
    else if (s[i] == '%' && s.compare(i, 3, "%2F") == 0) { o += '/'; i += 2; }
    else o += s[i];
  }
  return o;
}

}  // namespace

std::size_t DatasetInfo::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_CHECK(fd >= 0, "cannot open " << path << " for fsync: " << std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  DS_CHECK(rc == 0, "fsync of " << path << " failed: " << std::strerror(err));
}

H5File::H5File(const std::string& path, Mode mode) : path_(path), mode_(mode) {
  detail::silence_hdf5_errors();
  if (mode == Mode::Create) {
    Hid fapl(DS_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file " << path), H5Pclose);
    DS_H5_CHECK(H5Pset_alignment(fapl.get(), 65536, 4096), "file " << path << " (alignment)");
    id_ = DS_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), "file " << path);
  } else {
    // H5Fopen would block on a FIFO and report a directory as a corrupt file: say what it is.
    // (A missing file is left to H5Fopen's own error.)
    check_regular_file(path, "HDF5 file", /*missing_ok=*/true);
    id_ = DS_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "file " << path);
  }
}

H5File::~H5File() {
  if (id_ >= 0) {
    H5Fclose(id_);
    H5Eclear2(H5E_DEFAULT);
  }
}

H5File::H5File(H5File&& o) noexcept : id_(o.id_), path_(std::move(o.path_)), mode_(o.mode_) { o.id_ = -1; }

void H5File::close(bool sync) {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = -1;
  if (mode_ == Mode::Create) {
    herr_t rc = H5Fflush(id, H5F_SCOPE_LOCAL);
    if (rc < 0) { H5Fclose(id); DS_H5_CHECK(rc, "file " << path_ << " (flush)"); }
  }
  DS_H5_CHECK(H5Fclose(id), "file " << path_ << " (close)");
  if (mode_ == Mode::Create && sync) fsync_path(path_);
}

std::optional<RawExtent> H5File::create_raw(std::string_view name, DType dtype, std::span<const std::int64_t> shape) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  std::size_t n = 1;
  for (auto d : dims) n *= d;
  if (n == 0) {
    write(name, nullptr, dtype, shape);
    return std::nullopt;
  }
  Hid space(DS_H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr), path_), H5Sclose);
  Hid type = type_of(dtype);
  Hid lcpl = lcpl_intermediate();
  Hid dcpl(DS_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), path_), H5Pclose);
  DS_H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "file " << path_ << " dataset " << name);
  DS_H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "file " << path_ << " dataset " << name);
  DS_H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "file " << path_ << " dataset " << name);
  Hid dset(DS_H5_CHECK(H5Dcreate2(id_, str(name).c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                       "file " << path_ << " dataset " << name),
           H5Dclose);
  haddr_t off = H5Dget_offset(dset.get());
  DS_CHECK(off != HADDR_UNDEF, "HDF5 did not allocate storage for " << path_ << " dataset " << name);
  if (dtype == DType::BF16) set_attr(name, "dtype", "bf16");
  return RawExtent{std::uint64_t(off), std::uint64_t(n * dtype_size(dtype))};
}

std::optional<RawExtent> H5File::raw_extent(std::string_view name) const {
  if (!exists(name)) return std::nullopt;
  Hid dset(DS_H5_CHECK(H5Dopen2(id_, str(name).c_str(), H5P_DEFAULT), "file " << path_ << " dataset " << name), H5Dclose);
  Hid dcpl(DS_H5_CHECK(H5Dget_create_plist(dset.get()), "file " << path_ << " dataset " << name), H5Pclose);
  if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS || H5Pget_external_count(dcpl.get()) != 0 || H5Pget_nfilters(dcpl.get()) != 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  haddr_t off = H5Dget_offset(dset.get());
  if (off == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  Hid space(DS_H5_CHECK(H5Dget_space(dset.get()), "file " << path_ << " dataset " << name), H5Sclose);
  Hid type(DS_H5_CHECK(H5Dget_type(dset.get()), "file " << path_ << " dataset " << name), H5Tclose);
  hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
  std::size_t tsize = H5Tget_size(type.get());
  if (npoints < 0 || tsize == 0 || H5Tis_variable_str(type.get()) > 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  return RawExtent{std::uint64_t(off), std::uint64_t(npoints) * tsize};
}

void H5File::write(std::string_view name, const void* data, DType dtype, std::span<const std::int64_t> shape) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space(dims.empty() ? DS_H5_CHECK(H5Screate(H5S_SCALAR), path_)
                         : DS_H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr), path_),
            H5Sclose);
  Hid type = type_of(dtype);
  Hid lcpl = lcpl_intermediate();
  Hid dset(DS_H5_CHECK(H5Dcreate2(id_, str(name).c_str(), type.get(), space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                       "file " << path_ << " dataset " << name),
           H5Dclose);
  std::size_t n = 1;
  for (auto d : dims) n *= d;
  if (n > 0) {
    DS_H5_CHECK(H5Dwrite(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                "file " << path_ << " dataset " << name);
  }
  if (dtype == DType::BF16) set_attr(name, "dtype", "bf16");
}

bool H5File::exists(std::string_view name) const {
  return link_path_exists(id_, str(name));
}

DatasetInfo H5File::info(std::string_view name) const {
  DS_CHECK(exists(name), "checkpoint file " << path_ << " has no dataset '" << name << "'");
  Hid dset(DS_H5_CHECK(H5Dopen2(id_, str(name).c_str(), H5P_DEFAULT), "file " << path_ << " dataset " << name), H5Dclose);
  Hid space(DS_H5_CHECK(H5Dget_space(dset.get()), "file " << path_ << " dataset " << name), H5Sclose);
  Hid type(DS_H5_CHECK(H5Dget_type(dset.get()), "file " << path_ << " dataset " << name), H5Tclose);
  DatasetInfo info;
  int nd = DS_H5_CHECK(H5Sget_simple_extent_ndims(space.get()), "file " << path_ << " dataset " << name);
  std::vector<hsize_t> dims(std::size_t(std::max(nd, 0)));
  if (nd > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  info.shape.assign(dims.begin(), dims.end());
  H5T_class_t cls = H5Tget_class(type.get());
  std::size_t size = H5Tget_size(type.get());
  H5T_sign_t sign = cls == H5T_INTEGER ? H5Tget_sign(type.get()) : H5T_SGN_ERROR;
  if (cls == H5T_FLOAT && size == 4) info.dtype = DType::F32;
  else if (cls == H5T_FLOAT && size == 8) info.dtype = DType::F64;
  else if (cls == H5T_FLOAT && size == 2) info.dtype = DType::F16;
  else if (cls == H5T_INTEGER && size == 8 && sign == H5T_SGN_2) info.dtype = DType::I64;
  else if (cls == H5T_INTEGER && size == 4 && sign == H5T_SGN_2) info.dtype = DType::I32;
  else if (cls == H5T_INTEGER && size == 1 && sign == H5T_SGN_NONE) info.dtype = DType::U8;
  else if (cls == H5T_INTEGER && size == 2 && sign == H5T_SGN_NONE && has_attr(name, "dtype") &&
           attr_string(name, "dtype") == "bf16") info.dtype = DType::BF16;
  else DS_THROW("checkpoint file " << path_ << " dataset '" << name << "' has an element type dstrain does not read (class "
                                   << int(cls) << ", " << size << " bytes)");
  return info;
}

void H5File::read(std::string_view name, void* dst, DType dtype, std::size_t count) const {
  DatasetInfo di = info(name);
  DS_CHECK(di.dtype == dtype, "checkpoint file " << path_ << " dataset '" << name << "' holds " << dtype_name(di.dtype)
                                                 << ", expected " << dtype_name(dtype));
  DS_CHECK(di.numel() == count, "checkpoint file " << path_ << " dataset '" << name << "' has " << di.numel()
                                                   << " elements, expected " << count);
  if (count == 0) return;
  Hid dset(DS_H5_CHECK(H5Dopen2(id_, str(name).c_str(), H5P_DEFAULT), "file " << path_ << " dataset " << name), H5Dclose);
  Hid type = type_of(dtype);
  DS_H5_CHECK(H5Dread(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst), "file " << path_ << " dataset " << name);
}

void H5File::read_range(std::string_view name, void* dst, DType dtype, std::size_t offset, std::size_t count) const {
  DatasetInfo di = info(name);
  DS_CHECK(di.dtype == dtype, "checkpoint file " << path_ << " dataset '" << name << "' holds " << dtype_name(di.dtype)
                                                 << ", expected " << dtype_name(dtype));
  DS_CHECK(di.shape.size() == 1, "checkpoint file " << path_ << " dataset '" << name << "' is not 1-D");
  DS_CHECK(offset + count <= di.numel(), "checkpoint file " << path_ << " dataset '" << name << "': range [" << offset
                                                            << ", " << offset + count << ") beyond its " << di.numel()
                                                            << " elements");
  if (count == 0) return;
  Hid dset(DS_H5_CHECK(H5Dopen2(id_, str(name).c_str(), H5P_DEFAULT), "file " << path_ << " dataset " << name), H5Dclose);
  Hid fspace(DS_H5_CHECK(H5Dget_space(dset.get()), "file " << path_ << " dataset " << name), H5Sclose);
  hsize_t start = offset, cnt = count;
  DS_H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr),
              "file " << path_ << " dataset " << name);
  Hid mspace(DS_H5_CHECK(H5Screate_simple(1, &cnt, nullptr), path_), H5Sclose);
  Hid type = type_of(dtype);
  DS_H5_CHECK(H5Dread(dset.get(), type.get(), mspace.get(), fspace.get(), H5P_DEFAULT, dst),
              "file " << path_ << " dataset " << name << " range [" << offset << ", " << offset + count << ")");
}

void H5File::set_attr(std::string_view obj, std::string_view attr, std::string_view value) {
  Hid type = vlen_string_type();
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  std::string v(value);
  const char* p = v.c_str();
  std::string o = obj.empty() ? std::string("/") : str(obj);
  Hid a(DS_H5_CHECK(H5Acreate_by_name(id_, o.c_str(), str(attr).c_str(), type.get(), space.get(), H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT),
                    "file " << path_ << " object " << o << " attribute " << attr),
        H5Aclose);
  DS_H5_CHECK(H5Awrite(a.get(), type.get(), &p), "file " << path_ << " object " << o << " attribute " << attr);
}

void H5File::set_attr(std::string_view obj, std::string_view attr, std::int64_t value) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  std::string o = obj.empty() ? std::string("/") : str(obj);
  Hid a(DS_H5_CHECK(H5Acreate_by_name(id_, o.c_str(), str(attr).c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT),
                    "file " << path_ << " object " << o << " attribute " << attr),
        H5Aclose);
  DS_H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &value), "file " << path_ << " object " << o << " attribute " << attr);
}

bool H5File::has_attr(std::string_view obj, std::string_view attr) const {
  std::string o = obj.empty() ? std::string("/") : str(obj);
  htri_t e = H5Aexists_by_name(id_, o.c_str(), str(attr).c_str(), H5P_DEFAULT);
  if (e < 0) { H5Eclear2(H5E_DEFAULT); return false; }
  return e > 0;
}

std::string H5File::attr_string(std::string_view obj, std::string_view attr) const {
  std::string o = obj.empty() ? std::string("/") : str(obj);
  Hid a(DS_H5_CHECK(H5Aopen_by_name(id_, o.c_str(), str(attr).c_str(), H5P_DEFAULT, H5P_DEFAULT),
                    "file " << path_ << " object " << o << " attribute " << attr),
        H5Aclose);
  Hid ftype(H5Aget_type(a.get()), H5Tclose);
  DS_CHECK(H5Tget_class(ftype.get()) == H5T_STRING,
           "checkpoint file " << path_ << " object " << o << " attribute " << attr << " is not a string");
  Hid type = vlen_string_type();
  if (H5Tis_variable_str(ftype.get()) > 0) {
    char* p = nullptr;
    DS_H5_CHECK(H5Aread(a.get(), type.get(), &p), "file " << path_ << " object " << o << " attribute " << attr);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  std::size_t n = H5Tget_size(ftype.get());
  std::string s(n, '\0');
  DS_H5_CHECK(H5Aread(a.get(), ftype.get(), s.data()), "file " << path_ << " object " << o << " attribute " << attr);
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::int64_t H5File::attr_int(std::string_view obj, std::string_view attr) const {
  std::string o = obj.empty() ? std::string("/") : str(obj);
  Hid a(DS_H5_CHECK(H5Aopen_by_name(id_, o.c_str(), str(attr).c_str(), H5P_DEFAULT, H5P_DEFAULT),
                    "file " << path_ << " object " << o << " attribute " << attr),
        H5Aclose);
  std::int64_t v = 0;
  DS_H5_CHECK(H5Aread(a.get(), H5T_NATIVE_INT64, &v), "file " << path_ << " object " << o << " attribute " << attr);
  return v;
}

namespace {
herr_t list_cb(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> H5File::list(std::string_view group) const {
  std::string g = group.empty() ? std::string("/") : str(group);
  std::vector<std::string> names;
  Hid gid(DS_H5_CHECK(H5Gopen2(id_, g.c_str(), H5P_DEFAULT), "file " << path_ << " group " << g), H5Gclose);
  DS_H5_CHECK(H5Literate(gid.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, list_cb, &names),
              "file " << path_ << " group " << g);
  std::sort(names.begin(), names.end());
  return names;
}

// ---------------------------------------------------------------------------
// State trees: map -> group, list -> group with children "0", "1", ..., scalars and tensors
// -> datasets; every node carries the attribute ds_kind (docs/user/checkpoints.md).
// ---------------------------------------------------------------------------

void H5File::write_state(std::string_view name, const StateValue& v) {
  using K = StateValue::Kind;
  std::string n = str(name);
  std::string ctx = path_ + " state " + n;
  auto scalar = [&](hid_t type, const void* data) {
    Hid space(H5Screate(H5S_SCALAR), H5Sclose);
    Hid lcpl = lcpl_intermediate();
    Hid d(DS_H5_CHECK(H5Dcreate2(id_, n.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), ctx), H5Dclose);
    DS_H5_CHECK(H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), ctx);
  };
  switch (v.kind()) {
    case K::Map:
    case K::List: {
      if (!(n == "/" || exists(n))) {
        Hid lcpl = lcpl_intermediate();
        Hid g(DS_H5_CHECK(H5Gcreate2(id_, n.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), ctx), H5Gclose);
      }
      std::string prefix = n == "/" ? std::string("/") : n + "/";
      if (v.is_map()) {
        set_attr(n, "ds_kind", "map");
        for (const auto& [k, child] : v.as_map()) write_state(prefix + escape_key(k), child);
      } else {
        set_attr(n, "ds_kind", "list");
        set_attr(n, "length", std::int64_t(v.as_list().size()));
        for (std::size_t i = 0; i < v.as_list().size(); ++i) write_state(prefix + std::to_string(i), v.as_list()[i]);
      }
      return;
    }
    case K::Null: {
      Hid space(H5Screate(H5S_NULL), H5Sclose);
      Hid lcpl = lcpl_intermediate();
      Hid d(DS_H5_CHECK(H5Dcreate2(id_, n.c_str(), H5T_STD_U8LE, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), ctx),
            H5Dclose);
      break;
    }
    case K::Bool: {
      std::int8_t b = v.as_bool() ? 1 : 0;
      Hid t = bool_type();
      scalar(t.get(), &b);
      break;
    }
    case K::Int: {
      std::int64_t i = v.as_int();
      scalar(H5T_STD_I64LE, &i);
      break;
    }
    case K::Double: {
      double d = v.as_double();
      scalar(H5T_IEEE_F64LE, &d);
      break;
    }
    case K::String: {
      const std::string& s = v.as_string();
      DS_CHECK(s.find('\0') == std::string::npos, "client state string at '" << n << "' contains a NUL byte (HDF5 strings cannot)");
      const char* p = s.c_str();
      Hid t = vlen_string_type();
      scalar(t.get(), &p);
      break;
    }
    case K::Tensor: {
      const FloatTensor& t = v.as_tensor();
      std::size_t numel = 1;
      for (auto d : t.shape) {
        DS_CHECK(d >= 0, "client state tensor at '" << n << "' has a negative dimension");
        numel *= std::size_t(d);
      }
      DS_CHECK(numel == t.data.size(), "client state tensor at '" << n << "': shape holds " << numel << " elements, data "
                                                                  << t.data.size());
      write(n, t.data.data(), DType::F32, t.shape);
      break;
    }
  }
  set_attr(n, "ds_kind", kind_name(v.kind()));
}

StateValue H5File::read_state(std::string_view name) const {
  std::string n = str(name);
  std::string ctx = path_ + " state " + n;
  DS_CHECK(exists(n), "checkpoint file " << path_ << " has no state '" << n << "'");
  DS_CHECK(has_attr(n, "ds_kind"), "checkpoint file " << path_ << ": '" << n << "' has no ds_kind attribute (not a state tree)");
  std::string kind = attr_string(n, "ds_kind");
  std::string prefix = n == "/" ? std::string("/") : n + "/";
  if (kind == "map") {
    StateValue out = StateValue::map();
    for (const auto& child : list(n)) out.as_map().emplace(unescape_key(child), read_state(prefix + child));
    return out;
  }
  if (kind == "list") {
    std::int64_t len = attr_int(n, "length");
    StateValue out = StateValue::list();
    for (std::int64_t i = 0; i < len; ++i) out.push_back(read_state(prefix + std::to_string(i)));
    return out;
  }
  if (kind == "null") return StateValue::null();
  Hid d(DS_H5_CHECK(H5Dopen2(id_, n.c_str(), H5P_DEFAULT), ctx), H5Dclose);
  if (kind == "bool") {
    std::int8_t b = 0;
    Hid t = bool_type();
    DS_H5_CHECK(H5Dread(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &b), ctx);
    return StateValue(b != 0);
  }
  if (kind == "int64") {
    std::int64_t i = 0;
    DS_H5_CHECK(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &i), ctx);
    return StateValue(i);
  }
  if (kind == "double") {
    double x = 0;
    DS_H5_CHECK(H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x), ctx);
    return StateValue(x);
  }
  if (kind == "string") {
    Hid t = vlen_string_type();
    char* p = nullptr;
    DS_H5_CHECK(H5Dread(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p), ctx);
    std::string s = p ? p : "";
    H5free_memory(p);
    return StateValue(std::move(s));
  }
  if (kind == "tensor") {
    DatasetInfo di = info(n);
    FloatTensor t;
    t.shape = di.shape;
    t.data.resize(di.numel());
    read(n, t.data.data(), DType::F32, t.data.size());
    return StateValue(std::move(t));
  }
  DS_THROW("checkpoint file " << path_ << ": '" << n << "' has unknown ds_kind '" << kind << "'");
}

}  // namespace ds::io
