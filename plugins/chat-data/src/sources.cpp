// sources.cpp - see sources.h.
#include "sources.h"

#include <qrun/sdk/error.h>

#include <fmt/ranges.h>

#include <arrow/array.h>
#include <arrow/io/file.h>
#include <arrow/table.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace qrun::chatdata {
namespace {

bool is_data_file(const fs::path& p) {
  auto e = p.extension().string();
  return e == ".jsonl" || e == ".parquet";
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// A file belongs to `split` when a folder on its path (below the root) is named `split`, or its
// name starts with "<split>-", "<split>." or "<split>_0" (HF shard names: train-00000-of-00003).
bool in_split(const fs::path& rel, const std::string& split) {
  for (auto it = rel.begin(); it != rel.end(); ++it) {
    std::string part = it->string();
    if (std::next(it) != rel.end()) {
      if (part == split) return true;
      continue;
    }
    if (part.rfind(split, 0) == 0 && part.size() > split.size()) {
      char c = part[split.size()];
      if (c == '-' || c == '.') return true;
    }
  }
  return false;
}

void collect_dir(const fs::path& root, std::vector<std::string>& out) {
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec);
  QRUN_CHECK(!ec, "cannot list dataset folder {}: {}", root.string(), ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    QRUN_CHECK(!ec, "cannot list dataset folder {}: {}", root.string(), ec.message());
    const auto& p = it->path();
    if (p.filename().string().rfind('.', 0) == 0) {  // hidden: .cache, .git, .huggingface
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && is_data_file(p)) out.push_back(p.string());
  }
}

std::string hub_cache_dir() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HF_HOME"); h && *h) return (fs::path(h) / "hub").string();
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "huggingface" / "hub").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : "/") / ".cache" / "huggingface" / "hub").string();
}

bool looks_like_dataset_id(const std::string& p) {
  if (p.empty() || p[0] == '/' || p[0] == '.' || p[0] == '~') return false;
  if (std::count(p.begin(), p.end(), '/') != 1) return false;
  return p.find_first_of("*?[\\") == std::string::npos && p.back() != '/';
}

// The snapshot folder of an HF dataset in the hub cache, or nullopt.
std::optional<fs::path> hf_snapshot(const std::string& id, std::string& looked) {
  std::string org = id.substr(0, id.find('/')), name = id.substr(id.find('/') + 1);
  fs::path repo = fs::path(hub_cache_dir()) / ("datasets--" + org + "--" + name);
  looked = repo.string();
  std::error_code ec;
  if (!fs::is_directory(repo / "snapshots", ec)) return std::nullopt;
  std::ifstream ref(repo / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev) && !rev.empty() && fs::is_directory(repo / "snapshots" / rev, ec))
    return repo / "snapshots" / rev;
  std::vector<fs::path> snaps;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
    if (e.is_directory()) snaps.push_back(e.path());
  if (snaps.empty()) return std::nullopt;
  std::sort(snaps.begin(), snaps.end());
  QRUN_CHECK(snaps.size() == 1,
             "dataset '{}' has {} snapshots in {} and no refs/main; remove the stale ones or give "
             "the snapshot folder as the path",
             id, snaps.size(), (repo / "snapshots").string());
  return snaps[0];
}

std::string parquet_error_text(const std::exception& e) { return e.what(); }

}  // namespace

std::vector<std::string> resolve_files(const std::string& path,
                                       const std::optional<std::string>& split) {
  std::vector<std::string> files;
  fs::path root;
  std::error_code ec;
  std::string where = path;
  if (has_glob_chars(path)) {
    glob_t g{};
    int rc = ::glob(path.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; i++) {
        fs::path p = g.gl_pathv[i];
        if (fs::is_directory(p, ec)) collect_dir(p, files);
        else if (is_data_file(p)) files.push_back(p.string());
      }
    globfree(&g);
    QRUN_CHECK(!files.empty(), "dataset path '{}' matches no .jsonl or .parquet file", path);
  } else if (fs::is_regular_file(path, ec)) {
    QRUN_CHECK(is_data_file(path), "dataset file {} is neither .jsonl nor .parquet", path);
    files.push_back(path);
  } else if (fs::is_directory(path, ec)) {
    root = path;
    collect_dir(root, files);
  } else if (looks_like_dataset_id(path)) {
    std::string looked;
    auto snap = hf_snapshot(path, looked);
    QRUN_CHECK(snap.has_value(),
               "dataset '{}' is neither a local path nor in the Hugging Face cache (looked in {}); "
               "download it with `hf download --repo-type dataset {}` (set HF_HOME "
               "or HF_HUB_CACHE if your cache is elsewhere), or give a path to .jsonl/.parquet "
               "files",
               path, looked, path);
    root = *snap;
    where = fmt::format("{} ({})", path, root.string());
    collect_dir(root, files);
  } else {
    fail("dataset path '{}' does not exist (a .jsonl/.parquet file, a folder, a glob, or a "
         "Hugging Face dataset id such as HuggingFaceH4/ultrachat_200k)",
         path);
  }
  if (split && root.empty()) {  // a file or a glob: the split filters by file name
    std::vector<std::string> kept;
    for (auto& f : files)
      if (in_split(fs::path(f).filename(), *split)) kept.push_back(f);
    QRUN_CHECK(!kept.empty(), "dataset path '{}' has no files of split '{}' (files named '{}-*'); "
               "drop `split` to read {}", path, *split, *split, files.size() == 1 ? "the file" : "them all");
    files = std::move(kept);
  }
  if (split && !root.empty()) {
    std::vector<std::string> kept;
    for (auto& f : files)
      if (in_split(fs::path(f).lexically_relative(root), *split)) kept.push_back(f);
    QRUN_CHECK(!kept.empty(),
               "dataset {} has no files of split '{}' (a folder named '{}' or files named "
               "'{}-*'); found {} data files",
               where, *split, *split, *split, files.size());
    files = std::move(kept);
  }
  QRUN_CHECK(!files.empty(), "dataset {} holds no .jsonl or .parquet file", where);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

namespace {

void index_jsonl(const std::string& file, SourceIndex::FileInfo& info) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  QRUN_CHECK(fd >= 0, "cannot open {}: {}", file, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_t n = static_cast<size_t>(st.st_size);
  if (n == 0) {
    ::close(fd);
    return;
  }
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  QRUN_CHECK(m != MAP_FAILED, "cannot read {}: {}", file, std::strerror(errno));
  ::madvise(m, n, MADV_SEQUENTIAL);
  const char* d = static_cast<const char*>(m);
  size_t pos = 0;
  int64_t line = 0;
  while (pos < n) {
    line++;
    const void* nl = std::memchr(d + pos, '\n', n - pos);
    size_t end = nl ? static_cast<size_t>(static_cast<const char*>(nl) - d) : n;
    bool blank = true;
    for (size_t i = pos; i < end && blank; i++)
      blank = d[i] == ' ' || d[i] == '\t' || d[i] == '\r';
    if (!blank) {
      info.line_offsets.push_back(pos);
      info.line_ends.push_back(end);
      info.line_numbers.push_back(line);
    }
    pos = end + 1;
  }
  ::munmap(m, n);
}

std::unique_ptr<parquet::arrow::FileReader> open_parquet(const std::string& file) {
  try {
    auto in = arrow::io::ReadableFile::Open(file);
    QRUN_CHECK(in.ok(), "cannot open parquet file {}: {}", file, in.status().ToString());
    auto r = parquet::arrow::OpenFile(*in, arrow::default_memory_pool());
    QRUN_CHECK(r.ok(), "cannot read parquet file {} (truncated or not parquet?): {}", file,
               r.status().ToString());
    return std::move(*r);
  } catch (const parquet::ParquetException& e) {
    fail("cannot read parquet file {} (truncated or not parquet?): {}", file, parquet_error_text(e));
  }
}

void index_parquet(const std::string& file, SourceIndex::FileInfo& info,
                   std::vector<int64_t>& rg_rows) {
  auto reader = open_parquet(file);
  const auto& fields = reader->manifest().schema_fields;
  std::vector<std::string> names;
  for (const auto& f : fields) {
    names.push_back(f.field->name());
    if (f.field->name() != "messages") continue;
    // list<struct<...>>: fields[i].children[0] is the list element (the struct).
    if (f.children.size() == 1 && f.children[0].field->type()->id() == arrow::Type::STRUCT)
      for (const auto& c : f.children[0].children) {
        if (c.field->name() == "role") info.messages_leaf_role = c.column_index;
        if (c.field->name() == "content") info.messages_leaf_content = c.column_index;
      }
  }
  QRUN_CHECK(std::find(names.begin(), names.end(), "messages") != names.end(),
             "parquet file {} has no 'messages' column (columns: {}); qrun reads chat rows "
             "{{\"messages\": [{{\"role\", \"content\"}}, ...]}}",
             file, fmt::join(names, ", "));
  QRUN_CHECK(info.messages_leaf_role >= 0 && info.messages_leaf_content >= 0,
             "parquet file {}: column 'messages' is not a list of {{role, content}} structs", file);
  auto md = reader->parquet_reader()->metadata();
  for (int i = 0; i < md->num_row_groups(); i++) rg_rows.push_back(md->RowGroup(i)->num_rows());
}

std::optional<std::string_view> string_at(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return std::nullopt;
  switch (a.type_id()) {
    case arrow::Type::STRING: return static_cast<const arrow::StringArray&>(a).GetView(i);
    case arrow::Type::LARGE_STRING: return static_cast<const arrow::LargeStringArray&>(a).GetView(i);
    case arrow::Type::STRING_VIEW: return static_cast<const arrow::StringViewArray&>(a).GetView(i);
    case arrow::Type::BINARY: return static_cast<const arrow::BinaryArray&>(a).GetView(i);
    case arrow::Type::LARGE_BINARY: return static_cast<const arrow::LargeBinaryArray&>(a).GetView(i);
    default: return std::nullopt;
  }
}

const char* arrow_kind(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return "null";
  switch (a.type_id()) {
    case arrow::Type::INT8: case arrow::Type::INT16: case arrow::Type::INT32:
    case arrow::Type::INT64: case arrow::Type::UINT8: case arrow::Type::UINT16:
    case arrow::Type::UINT32: case arrow::Type::UINT64: case arrow::Type::FLOAT:
    case arrow::Type::DOUBLE: return "number";
    case arrow::Type::BOOL: return "bool";
    case arrow::Type::LIST: case arrow::Type::LARGE_LIST: return "list";
    case arrow::Type::STRUCT: return "object";
    default: return "other";
  }
}

// Converts the `messages` value of row `r` of a list array into RawRow fields.
template <typename ListT>
void convert_rows(const ListT& list, int64_t base_row, std::vector<RawRow>& out) {
  const auto& st = static_cast<const arrow::StructArray&>(*list.values());
  auto role = st.GetFieldByName("role");
  auto content = st.GetFieldByName("content");
  for (int64_t r = 0; r < list.length(); r++) {
    RawRow row;
    row.row = base_row + r + 1;
    if (list.IsNull(r)) {
      row.error = "missing 'messages'";
      out.push_back(std::move(row));
      continue;
    }
    int64_t b = list.value_offset(r), e = list.value_offset(r + 1);
    for (int64_t k = b; k < e; k++) {
      int64_t idx = k - b;
      if (st.IsNull(k)) {
        row.error = fmt::format("message {} is not an object (got null)", idx);
        break;
      }
      auto rv = role ? string_at(*role, k) : std::nullopt;
      if (!rv) {
        row.error = role ? fmt::format("message {}: 'role' is not a string (got {})", idx,
                                       arrow_kind(*role, k))
                         : fmt::format("message {}: missing 'role'", idx);
        break;
      }
      auto cv = content ? string_at(*content, k) : std::nullopt;
      if (!cv) {
        row.error = content ? fmt::format("message {}: 'content' is not a string (got {})", idx,
                                          arrow_kind(*content, k))
                            : fmt::format("message {}: missing 'content'", idx);
        break;
      }
      row.messages.push_back(RowMessage{std::string(*rv), std::string(*cv)});
    }
    if (row.error) row.messages.clear();
    out.push_back(std::move(row));
  }
}

}  // namespace

std::shared_ptr<const SourceIndex> SourceIndex::build(std::vector<std::string> files) {
  auto idx = std::make_shared<SourceIndex>();
  idx->files_ = std::move(files);
  idx->info_.resize(idx->files_.size());
  for (size_t f = 0; f < idx->files_.size(); f++) {
    const std::string& file = idx->files_[f];
    FileInfo& info = idx->info_[f];
    info.jsonl = fs::path(file).extension() == ".jsonl";
    std::vector<int64_t> block_rows;
    if (info.jsonl) {
      index_jsonl(file, info);
      int64_t n = static_cast<int64_t>(info.line_offsets.size());
      for (int64_t b = 0; b < n; b += kJsonlBlockRows) block_rows.push_back(std::min(kJsonlBlockRows, n - b));
    } else {
      index_parquet(file, info, block_rows);
    }
    for (size_t b = 0; b < block_rows.size(); b++) {
      if (block_rows[b] == 0) continue;
      idx->blocks_.push_back(Block{static_cast<int32_t>(f), idx->num_rows_, block_rows[b],
                                   static_cast<int64_t>(b)});
      idx->num_rows_ += block_rows[b];
    }
  }
  return idx;
}

std::vector<RawRow> SourceIndex::read_block(const Block& b) const {
  const std::string& file = files_[b.file];
  const FileInfo& info = info_[b.file];
  std::vector<RawRow> out;
  out.reserve(b.rows);
  if (info.jsonl) {
    size_t first = static_cast<size_t>(b.index_in_file * kJsonlBlockRows);
    size_t last = first + static_cast<size_t>(b.rows) - 1;
    uint64_t off = info.line_offsets[first], end = info.line_ends[last];
    std::string buf(end - off, '\0');
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    QRUN_CHECK(fd >= 0, "cannot open {}: {}", file, std::strerror(errno));
    size_t got = 0;
    while (got < buf.size()) {
      ssize_t r = ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(off + got));
      if (r <= 0) {
        int err = errno;
        ::close(fd);
        fail("cannot read {} (changed since it was indexed?): {}", file,
             r == 0 ? "unexpected end of file" : std::strerror(err));
      }
      got += static_cast<size_t>(r);
    }
    ::close(fd);
    for (size_t i = first; i <= last; i++) {
      RawRow row;
      row.is_jsonl = true;
      row.file = b.file;
      row.row = info.line_numbers[i];
      row.line.assign(buf, info.line_offsets[i] - off, info.line_ends[i] - info.line_offsets[i]);
      out.push_back(std::move(row));
    }
  } else {
    auto reader = open_parquet(file);
    std::shared_ptr<arrow::Table> table;
    try {
      auto t = reader->ReadRowGroup(static_cast<int>(b.index_in_file),
                                    {info.messages_leaf_role, info.messages_leaf_content});
      QRUN_CHECK(t.ok(), "cannot read parquet file {} row group {}: {}", file, b.index_in_file,
                 t.status().ToString());
      table = *t;
    } catch (const parquet::ParquetException& e) {
      fail("cannot read parquet file {} row group {}: {}", file, b.index_in_file, e.what());
    }
    int64_t base = 0;
    for (int64_t g = 0; g < b.index_in_file; g++)
      base += reader->parquet_reader()->metadata()->RowGroup(static_cast<int>(g))->num_rows();
    auto col = table->GetColumnByName("messages");
    QRUN_CHECK(col != nullptr, "parquet file {}: no 'messages' column in row group {}", file,
               b.index_in_file);
    int64_t r0 = base;
    for (const auto& chunk : col->chunks()) {
      size_t before = out.size();
      if (chunk->type_id() == arrow::Type::LIST)
        convert_rows(static_cast<const arrow::ListArray&>(*chunk), r0, out);
      else if (chunk->type_id() == arrow::Type::LARGE_LIST)
        convert_rows(static_cast<const arrow::LargeListArray&>(*chunk), r0, out);
      else
        fail("parquet file {}: column 'messages' has type {}, expected a list of {{role, content}}",
             file, chunk->type()->ToString());
      r0 += static_cast<int64_t>(out.size() - before);
    }
    QRUN_CHECK(static_cast<int64_t>(out.size()) == b.rows,
               "parquet file {} row group {}: read {} rows, the footer says {}", file,
               b.index_in_file, out.size(), b.rows);
    for (auto& row : out) row.file = b.file;
  }
  for (int64_t i = 0; i < b.rows; i++) out[i].id = b.first_id + i;
  return out;
}

}  // namespace qrun::chatdata
