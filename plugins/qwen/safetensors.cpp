// plugins/qwen/safetensors.cpp - see safetensors.h. Every number read from a file is checked
// before it is used: header length against the file size, each tensor's byte range against the
// data size and against dtype size x shape (with overflow checks), and ranges must not overlap.
#include "safetensors.h"

#include <qrun/sdk/error.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace qrun::safetensors {

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MiB, as the reference implementation
constexpr int kMaxDepth = 16;                  // the format needs depth 3

// nlohmann's parser is iterative, but keep hostile nesting out before it builds a tree.
bool nesting_ok(const char* p, size_t n) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t i = 0; i < n; ++i) {
    char c = p[i];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

bool as_u64(const nlohmann::json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

}  // namespace

const TensorInfo* Header::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

Header parse_header(const uint8_t* data, size_t size, const std::string& file) {
  QRUN_CHECK(size >= 8, "safetensors file {}: truncated ({} bytes; a header needs at least 8)",
             file, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  QRUN_CHECK(n <= kMaxHeader, "safetensors file {}: header length {} exceeds the 100 MiB limit",
             file, n);
  QRUN_CHECK(n <= size - 8,
             "safetensors file {}: truncated: header says {} bytes of JSON but the file has only {} "
             "bytes after the length field",
             file, n, size - 8);
  const char* jp = reinterpret_cast<const char*>(data + 8);
  QRUN_CHECK(nesting_ok(jp, n), "safetensors file {}: header JSON nested too deeply", file);
  nlohmann::json j = nlohmann::json::parse(jp, jp + n, nullptr, /*allow_exceptions=*/false);
  QRUN_CHECK(!j.is_discarded(), "safetensors file {}: header is not valid JSON", file);
  QRUN_CHECK(j.is_object(), "safetensors file {}: header is not a JSON object", file);

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      QRUN_CHECK(v.is_object(), "safetensors file {}: __metadata__ is not an object", file);
      for (auto m = v.begin(); m != v.end(); ++m) {
        QRUN_CHECK(m.value().is_string(),
                   "safetensors file {}: __metadata__ value of '{}' is not a string", file,
                   m.key());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    QRUN_CHECK(v.is_object(), "safetensors file {}: entry of tensor '{}' is not an object", file,
               name);
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    QRUN_CHECK(dt != v.end() && dt->is_string(),
               "safetensors file {}: tensor '{}' has no dtype string", file, name);
    t.dtype = dt->get<std::string>();
    size_t esize = dtype_size(t.dtype);
    QRUN_CHECK(esize > 0, "safetensors file {}: tensor '{}' has unknown dtype '{}'", file, name,
               t.dtype);
    auto sh = v.find("shape");
    QRUN_CHECK(sh != v.end() && sh->is_array() && sh->size() <= 16,
               "safetensors file {}: tensor '{}' has no valid shape (an array of at most 16 sizes)",
               file, name);
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      uint64_t x = 0;
      QRUN_CHECK(as_u64(d, x) && x <= (1ull << 40),
                 "safetensors file {}: tensor '{}' has an invalid dimension in its shape", file,
                 name);
      t.shape.push_back(static_cast<int64_t>(x));
      if (x != 0 && numel > UINT64_MAX / x) overflow = true;
      else numel *= x;
    }
    QRUN_CHECK(!overflow && numel <= UINT64_MAX / esize,
               "safetensors file {}: tensor '{}' shape is too large", file, name);
    const uint64_t nbytes = numel * esize;
    auto off = v.find("data_offsets");
    QRUN_CHECK(off != v.end() && off->is_array() && off->size() == 2 && as_u64((*off)[0], t.begin) &&
                   as_u64((*off)[1], t.end),
               "safetensors file {}: tensor '{}' has no valid data_offsets [begin, end]", file,
               name);
    QRUN_CHECK(t.begin <= t.end,
               "safetensors file {}: tensor '{}' has data_offsets [{}, {}] with begin > end", file,
               name, t.begin, t.end);
    QRUN_CHECK(t.end <= data_size,
               "safetensors file {}: tensor '{}' data_offsets [{}, {}] run past the end of the data "
               "({} bytes): the file is truncated or its header lies",
               file, name, t.begin, t.end, data_size);
    QRUN_CHECK(t.end - t.begin == nbytes,
               "safetensors file {}: tensor '{}' data_offsets [{}, {}] span {} bytes but {} {} "
               "needs {}",
               file, name, t.begin, t.end, t.end - t.begin, t.dtype, fmt::format("{}", t.shape),
               nbytes);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const auto& a = h.tensors[i - 1];
    const auto& b = h.tensors[i];
    QRUN_CHECK(b.begin >= a.end || a.begin == a.end || b.begin == b.end,
               "safetensors file {}: tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}))",
               file, a.name, b.name, a.begin, a.end, b.begin, b.end);
  }
  return h;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  QRUN_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot read {}: not a regular file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("cannot mmap {}: {}", path, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

File open(const std::string& path) {
  File f;
  f.map = std::make_shared<MappedFile>(path);
  static const uint8_t empty[1] = {0};
  f.header = parse_header(f.map->data() ? f.map->data() : empty, f.map->size(), path);
  return f;
}

void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string hdr = j.dump();
  while (hdr.size() % 8 != 0) hdr.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  QRUN_CHECK(out.good(), "cannot write {}: {}", path, std::strerror(errno));
  uint8_t len[8];
  uint64_t n = hdr.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(hdr.data(), static_cast<std::streamsize>(hdr.size()));
  for (const auto& t : tensors)
    if (t.nbytes > 0) out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
  out.flush();
  QRUN_CHECK(out.good(), "writing {} failed: {}", path, std::strerror(errno));
}

}  // namespace qrun::safetensors
