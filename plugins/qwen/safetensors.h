// plugins/qwen/safetensors.h - a small, bounds-checked safetensors reader/writer (no LibTorch).
//
// Format: u64 little-endian N, then N bytes of JSON {name: {dtype, shape, data_offsets:[b, e]},
// "__metadata__": {str: str}}, then the data; offsets are relative to the data start.
// Why our own: the reader must never trust the file (checkpoints come from the internet and the
// parser is fuzzed, tests/model/fuzz_safetensors.cpp): every offset, size and product is checked,
// and every problem is a qrun::UserError naming the file and the tensor. Files are mmap'ed, so a
// checkpoint is never held twice in RAM. Torch conversion lives with the model (qwen_model.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qrun::safetensors {

struct TensorInfo {
  std::string name;
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0; // byte range relative to the data start
};

struct Header {
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;          // absolute offset of the data (8 + N)
  const TensorInfo* find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype string, 0 for an unknown one.
size_t dtype_size(const std::string& dtype);

// Parses and validates the header of the safetensors file held in [data, data + size).
// `file` names it in messages. Throws qrun::UserError for anything malformed.
Header parse_header(const uint8_t* data, size_t size, const std::string& file);

// A read-only memory map of a whole file. Throws UserError if it cannot be opened.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A header parsed from a mapped file (keeps the mapping alive).
struct File {
  std::shared_ptr<MappedFile> map;
  Header header;
  const uint8_t* tensor_data(const TensorInfo& t) const {
    return map->data() + header.data_start + t.begin;
  }
};
File open(const std::string& path);

struct WriteTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a safetensors file (header padded to a multiple of 8 bytes). Throws UserError on I/O
// failure.
void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata);

}  // namespace qrun::safetensors
