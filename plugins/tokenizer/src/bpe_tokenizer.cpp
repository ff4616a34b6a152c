// bpe_tokenizer.cpp - see bpe_tokenizer.h.
#include "bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <qrun/sdk/error.h>
#include <queue>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace qrun::tok {

namespace {

// Ids below the largest one that no token uses (see the id tables in the loader).
constexpr int64_t kMaxUnusedIds = 65536;

using json = nlohmann::json;

// ----------------------------------------------------------------------------------------------
// UTF-8

// Length (1..4) of the valid UTF-8 sequence at p, or 0 with *bad = length of the maximal invalid
// subpart (>= 1), per Unicode 15 section 3.9 / Table 3-7.
inline size_t utf8_seq(const unsigned char* p, size_t n, size_t* bad) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2;
    lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2;
    hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3;
    hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t i = 1; i <= need; ++i) {
    if (i >= n) {
      *bad = i;
      return 0;
    }
    unsigned b = p[i];
    if (b < lo || b > hi) {
      *bad = i;
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

// Decodes the valid UTF-8 code point at p (length len).
inline uint32_t utf8_cp(const unsigned char* p, size_t len) {
  switch (len) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
             (p[3] & 0x3Fu);
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ----------------------------------------------------------------------------------------------
// GPT-2 byte <-> unicode symbol map (bytes_to_unicode).

struct ByteLevelMap {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // -1: not a byte-level symbol
  ByteLevelMap() {
    cp_to_byte.fill(-1);
    auto keep = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = keep(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelMap& byte_map() {
  static const ByteLevelMap m;
  return m;
}

// Bytes of a byte-level spelling; nullopt if some character is not a byte-level symbol.
std::optional<std::string> spelling_to_bytes(std::string_view sp) {
  const auto& m = byte_map();
  std::string out;
  out.reserve(sp.size());
  const auto* p = reinterpret_cast<const unsigned char*>(sp.data());
  size_t i = 0, n = sp.size();
  while (i < n) {
    size_t bad = 0;
    size_t len = utf8_seq(p + i, n - i, &bad);
    if (len == 0) return std::nullopt;
    uint32_t cp = utf8_cp(p + i, len);
    if (cp >= m.cp_to_byte.size() || m.cp_to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(m.cp_to_byte[cp]);
    i += len;
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// NFC

// True if every code point of `s` is one that NFC can never change in any context (so `s` is
// already NFC): below U+0300, CJK ideographs, Hangul syllables, kana without the combining marks.
bool trivially_nfc(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c < 0xCC) {  // ASCII or U+0080..U+02FF (continuation bytes are skipped below)
      i += (c < 0x80) ? 1 : 2;
      continue;
    }
    size_t bad;
    size_t len = utf8_seq(p + i, n - i, &bad);
    if (len == 0) return false;
    uint32_t cp = utf8_cp(p + i, len);
    bool safe = (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
                (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x3041 && cp <= 0x3096) ||
                (cp >= 0x30A1 && cp <= 0x30FA) || (cp >= 0xFF01 && cp <= 0xFF5E);
    if (!safe) return false;
    i += len;
  }
  return true;
}

// NFC of valid UTF-8 `s` into `out`; returns false (out untouched) if `s` is already NFC.
bool nfc(std::string_view s, std::string& out) {
  if (trivially_nfc(s)) return false;
  utf8proc_uint8_t* res = nullptr;
  utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &res,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    throw UserError(fmt::format("NFC normalization failed: {}", utf8proc_errmsg(len)));
  }
  std::string_view r(reinterpret_cast<const char*>(res), static_cast<size_t>(len));
  bool changed = r != s;
  if (changed) out.assign(r);
  std::free(res);
  return changed;
}

// ----------------------------------------------------------------------------------------------
// PCRE2

struct ThreadMatch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatch() {
    md = pcre2_match_data_create(4, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (mctx && stack) pcre2_jit_stack_assign(mctx, nullptr, stack);
    // Long whitespace runs make the split regex backtrack over the whole run (as Oniguruma
    // does, without a limit); PCRE2's default limit of 10M steps would fail on ~10 MB runs.
    if (mctx) pcre2_set_match_limit(mctx, 0xFFFFFFFFu);
  }
  ~ThreadMatch() {
    if (md) pcre2_match_data_free(md);
    if (mctx) pcre2_match_context_free(mctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};
ThreadMatch& thread_match() {
  thread_local ThreadMatch tm;
  return tm;
}

// Oniguruma (HF) \s is the Unicode White_Space property; PCRE2's UCP \s also matches U+180E
// (via \h). onig_compatible() rewrites \s / \S to explicit White_Space classes and extends
// \p{L}, \p{N}, \p{M} with the code points PCRE2's older Unicode tables lack, so both engines
// agree on every code point for these classes (other properties use PCRE2's tables as they are).
constexpr const char* kWhiteSpaceItems =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Code points that HF's Oniguruma (Unicode 16 tables, tokenizers 0.23) puts in \p{L}, \p{N},
// \p{M} but PCRE2 10.42 (Unicode 14) does not; generated by comparing both engines over all code
// points (PCRE2 has no code point in these classes that Oniguruma lacks).
struct ExtraClass {
  const char* prop;
  const char* items;
};
constexpr ExtraClass kExtraClasses[] = {
    {"\\p{L}", "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"},
    {"\\p{N}", "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"},
    {"\\p{M}", "\\x{897}\\x{CF3}\\x{ECE}\\x{10D69}-\\x{10D6D}\\x{10EFC}-\\x{10EFF}\\x{11241}\\x{113B8}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D0}\\x{113D2}\\x{113E1}-\\x{113E2}\\x{11F00}-\\x{11F01}\\x{11F03}\\x{11F34}-\\x{11F3A}\\x{11F3E}-\\x{11F42}\\x{11F5A}\\x{13440}\\x{13447}-\\x{13455}\\x{1611E}-\\x{1612F}\\x{1E08F}\\x{1E4EC}-\\x{1E4EF}\\x{1E5EE}-\\x{1E5EF}"},
};

std::string onig_compatible(const std::string& pat, const std::string& origin) {
  std::string out;
  out.reserve(pat.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pat.size(); ++i) {
    char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      char d = pat[i + 1];
      const ExtraClass* extra = nullptr;
      for (const auto& x : kExtraClasses) {
        if (pat.compare(i, 5, x.prop) == 0) extra = &x;
      }
      if (extra) {
        out += in_class ? std::string(extra->prop) + extra->items
                        : std::string("[") + extra->prop + extra->items + "]";
        i += 4;
        continue;
      }
      if (d == 's') {
        out += in_class ? std::string(kWhiteSpaceItems)
                        : std::string("[") + kWhiteSpaceItems + "]";
      } else if (d == 'S') {
        if (in_class) {
          throw UserError(fmt::format(
              "tokenizer file '{}': unsupported pre_tokenizer Split pattern {}: \\S inside a "
              "character class",
              origin, json(pat).dump()));
        }
        out += std::string("[^") + kWhiteSpaceItems + "]";
      } else {
        out += c;
        out += d;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // a ']' right after '[' or '[^' is a literal
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pat.size() && pat[i + 1] == ':') {
      size_t e = pat.find(":]", i + 2);
      if (e != std::string::npos) {
        out.append(pat, i, e + 2 - i);
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  Regex(const std::string& pattern, bool literal, const std::string& origin) {
    int err = 0;
    PCRE2_SIZE erroff = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
    const std::string pat = literal ? pattern : onig_compatible(pattern, origin);
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts, &err,
                         &erroff, nullptr);
    if (!code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      throw UserError(fmt::format(
          "tokenizer file '{}': pre_tokenizer Split pattern {} does not compile with PCRE2 at "
          "offset {}: {}",
          origin, json(pattern).dump(), erroff, reinterpret_cast<const char*>(buf)));
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls emit(begin, end) for every match and every gap between matches ("Isolated"), in
  // order, skipping empty pieces.
  template <typename F>
  void split(std::string_view s, size_t base, F&& emit) const {
    auto& tm = thread_match();
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t n = s.size(), pos = 0, prev = 0;
    while (pos <= n) {
      int rc = jit ? pcre2_jit_match(code, subj, n, pos, 0, tm.md, tm.mctx)
                   : pcre2_match(code, subj, n, pos, PCRE2_NO_UTF_CHECK, tm.md, tm.mctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof(buf));
        throw UserError(fmt::format("pre-tokenizer regex match failed: {}",
                                    reinterpret_cast<const char*>(buf)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tm.md);
      size_t st = ov[0], en = ov[1];
      if (st > prev) emit(base + prev, base + st);
      if (en > st) emit(base + st, base + en);
      prev = std::max(prev, en);
      if (en == st) {
        if (en >= n) break;
        size_t bad;
        size_t l = utf8_seq(reinterpret_cast<const unsigned char*>(s.data()) + en, n - en, &bad);
        pos = en + (l ? l : 1);
      } else {
        pos = en;
      }
    }
    if (prev < n) emit(base + prev, base + n);
  }
};

// ----------------------------------------------------------------------------------------------
// Merge table: (left id, right id) -> (rank, merged id), open addressing.

class MergeTable {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t id;
  };
  void build(size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 16) cap <<= 1;
    slots_.assign(cap, Entry{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask_;
    slots_[i] = Entry{k, rank, id};  // a repeated pair keeps the last rank, as HF's HashMap
  }
  const Entry* find(int32_t a, int32_t b) const {
    uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == k) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 17); }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// ----------------------------------------------------------------------------------------------
// Word cache: sharded, each shard a bounded hash map behind a mutex.

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

class WordCache {
 public:
  static constexpr size_t kShards = 64;
  static constexpr size_t kPerShard = 8192;
  static constexpr size_t kMaxWordBytes = 256;

  bool get(std::string_view w, size_t h, std::vector<int32_t>& out) const {
    Shard& s = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(w);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view w, size_t h, const int32_t* ids, size_t n) const {
    Shard& s = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kPerShard) s.map.clear();
    s.map.emplace(std::string(w), std::vector<int32_t>(ids, ids + n));
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> shards_;
};

struct AddedTok {
  std::string content;  // what is matched (NFC'd when normalized=true and the normalizer is NFC)
  int32_t id;
  bool special;
  bool normalized;
};

struct AddedMatcher {
  std::array<std::vector<uint32_t>, 256> by_first;  // indices into added, longest first
  bool any = false;
};

std::string jdump(const json& j) {
  std::string s = j.dump();
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

struct BpeTokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>> model_vocab;  // spelling->id
  std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>> added_vocab;  // content->id
  std::vector<std::string> spelling;    // id -> spelling
  std::vector<std::string> dec_bytes;   // id -> decoded bytes (HF ByteLevel decoder rule)
  std::vector<uint8_t> exists, special;
  std::vector<AddedTok> added;
  AddedMatcher raw_matcher, norm_matcher;
  bool use_nfc = false;
  std::vector<std::unique_ptr<Regex>> splits;
  std::array<int32_t, 256> byte_id{};
  MergeTable merges;
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>> bytes_vocab;  // ignore_merges
  int64_t distinct = 0;
  WordCache cache;

  void bpe_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void pretokenize_and_bpe(std::string_view text, size_t step, std::vector<int32_t>& ids,
                           std::vector<size_t>* ends, size_t base) const;
  void encode_segment(std::string_view seg, size_t base, bool parse_special,
                      std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const;
  void encode(std::string_view text, bool parse_special, std::vector<int32_t>& ids,
              std::vector<TokenSpan>* spans) const;
};

namespace {

struct Sym {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;
};
struct HeapItem {
  int32_t rank;
  int32_t pos;
  int32_t id;
  bool operator>(const HeapItem& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

// BPE on one pre-tokenized piece (raw bytes), as HF's Word::merge_all: repeatedly merge the
// lowest-rank adjacent pair, leftmost first on equal ranks.
void BpeTokenizer::Impl::bpe_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  const size_t n = piece.size();
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  if (n == 1) {
    ids.push_back(byte_id[p[0]]);
    return;
  }
  if (ignore_merges) {
    auto it = bytes_vocab.find(piece);
    if (it != bytes_vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const bool cacheable = n <= WordCache::kMaxWordBytes;
  size_t h = 0;
  if (cacheable) {
    h = SvHash{}(piece);
    if (cache.get(piece, h, ids)) return;
  }
  thread_local std::vector<Sym> syms;
  thread_local std::vector<HeapItem> heap_store;
  syms.resize(n);
  for (size_t i = 0; i < n; ++i) {
    syms[i] = Sym{byte_id[p[i]], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1, 1};
  }
  heap_store.clear();
  std::priority_queue<HeapItem, std::vector<HeapItem>, std::greater<HeapItem>> heap(
      std::greater<HeapItem>{}, std::move(heap_store));
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const auto* e = merges.find(syms[i].id, syms[i + 1].id)) {
      heap.push(HeapItem{e->rank, static_cast<int32_t>(i), e->id});
    }
  }
  while (!heap.empty()) {
    HeapItem top = heap.top();
    heap.pop();
    Sym& s = syms[top.pos];
    if (s.len == 0 || s.next < 0) continue;
    Sym& r = syms[s.next];
    const auto* e = merges.find(s.id, r.id);
    if (!e || e->id != top.id) continue;
    s.id = top.id;
    s.len += r.len;
    s.next = r.next;
    r.len = 0;
    if (s.next >= 0) syms[s.next].prev = top.pos;
    if (s.prev >= 0) {
      if (const auto* e2 = merges.find(syms[s.prev].id, s.id)) {
        heap.push(HeapItem{e2->rank, s.prev, e2->id});
      }
    }
    if (s.next >= 0) {
      if (const auto* e2 = merges.find(s.id, syms[s.next].id)) {
        heap.push(HeapItem{e2->rank, top.pos, e2->id});
      }
    }
  }
  const size_t start = ids.size();
  for (int32_t i = 0; i >= 0; i = syms[i].next) ids.push_back(syms[i].id);
  if (cacheable) cache.put(piece, h, ids.data() + start, ids.size() - start);
}

// Applies split step `step` (and the following ones) to `text`, then BPE. Appends the end offset
// (base + relative) of each token to *ends when given.
void BpeTokenizer::Impl::pretokenize_and_bpe(std::string_view text, size_t step,
                                             std::vector<int32_t>& ids,
                                             std::vector<size_t>* ends, size_t base) const {
  if (text.empty()) return;
  if (step == splits.size()) {
    size_t before = ids.size();
    bpe_piece(text, ids);
    if (ends) {
      size_t off = base;
      for (size_t i = before; i < ids.size(); ++i) {
        off += dec_bytes[ids[i]].size();
        ends->push_back(off);
      }
    }
    return;
  }
  splits[step]->split(text, 0, [&](size_t b, size_t e) {
    pretokenize_and_bpe(text.substr(b, e - b), step + 1, ids, ends, base + b);
  });
}

namespace {
// Finds the leftmost-longest added token in s[from..); returns (pos, index) or pos = npos.
std::pair<size_t, uint32_t> find_added(const AddedMatcher& m, const std::vector<AddedTok>& added,
                                       std::string_view s, size_t from) {
  const size_t n = s.size();
  for (size_t i = from; i < n; ++i) {
    const auto& cands = m.by_first[static_cast<unsigned char>(s[i])];
    if (cands.empty()) continue;
    for (uint32_t k : cands) {
      const std::string& c = added[k].content;
      if (c.size() <= n - i && std::memcmp(s.data() + i, c.data(), c.size()) == 0) {
        return {i, k};
      }
    }
  }
  return {std::string_view::npos, 0};
}
}  // namespace

// One stretch of raw text without (raw-matched) added tokens: normalize, match normalized added
// tokens, pre-tokenize, BPE.
void BpeTokenizer::Impl::encode_segment(std::string_view seg, size_t base, bool parse_special,
                                        std::vector<int32_t>& ids,
                                        std::vector<TokenSpan>* spans) const {
  if (seg.empty()) return;
  thread_local std::string norm_buf;
  std::string_view norm = seg;
  bool changed = false;
  if (use_nfc && nfc(seg, norm_buf)) {
    norm = norm_buf;
    changed = true;
  }
  // Offsets: identity when NFC changed nothing; else exact up to the common prefix p.
  size_t p = 0;
  if (changed) {
    while (p < norm.size() && p < seg.size() && norm[p] == seg[p]) ++p;
  }
  auto map_begin = [&](size_t o) { return base + (!changed || o <= p ? o : p); };
  auto map_end = [&](size_t o) { return base + (!changed || o <= p ? o : seg.size()); };

  std::vector<size_t> ends_storage;
  std::vector<size_t>* ends = spans ? &ends_storage : nullptr;
  const size_t first = ids.size();
  size_t pos = 0, scan = 0;
  if (norm_matcher.any) {
    while (pos < norm.size()) {
      auto [at, k] = find_added(norm_matcher, added, norm, scan);
      if (at == std::string_view::npos) break;
      scan = at + added[k].content.size();
      if (added[k].special && !parse_special) continue;
      pretokenize_and_bpe(norm.substr(pos, at - pos), 0, ids, ends, pos);
      ids.push_back(added[k].id);
      if (ends) ends->push_back(scan);
      pos = scan;
    }
  }
  pretokenize_and_bpe(norm.substr(pos), 0, ids, ends, pos);
  if (spans) {
    size_t prev = 0;
    for (size_t i = 0; i < ids.size() - first; ++i) {
      size_t e = (*ends)[i];
      spans->push_back(TokenSpan{static_cast<uint32_t>(map_begin(prev)),
                                 static_cast<uint32_t>(map_end(e))});
      prev = e;
    }
  }
}

void BpeTokenizer::Impl::encode(std::string_view text, bool parse_special,
                                std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const {
  size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    throw UserError(fmt::format("text is not valid UTF-8 at byte {} (of {})", bad, text.size()));
  }
  if (spans && text.size() > UINT32_MAX) {
    throw UserError(fmt::format("text of {} bytes is too long for token offsets", text.size()));
  }
  size_t seg_start = 0, pos = 0;
  if (raw_matcher.any) {
    while (pos < text.size()) {
      auto [at, k] = find_added(raw_matcher, added, text, pos);
      if (at == std::string_view::npos) break;
      const AddedTok& t = added[k];
      pos = at + t.content.size();
      if (t.special && !parse_special) continue;  // left in the text, as HF encode_special_tokens
      encode_segment(text.substr(seg_start, at - seg_start), seg_start, parse_special, ids, spans);
      ids.push_back(t.id);
      if (spans) spans->push_back(TokenSpan{static_cast<uint32_t>(at), static_cast<uint32_t>(pos)});
      seg_start = pos;
    }
  }
  encode_segment(text.substr(seg_start), seg_start, parse_special, ids, spans);
}

// ------------------------------------------------------------------------------------------------
// Loading

namespace {

[[noreturn]] void unsupported(const std::string& origin, const std::string& field, const json& v,
                              const std::string& supported) {
  throw UserError(fmt::format("tokenizer file '{}': unsupported {} = {}; qrun supports {}", origin,
                              field, jdump(v), supported));
}

const json& require(const json& obj, const std::string& origin, const std::string& field,
                    const char* key, json::value_t type, const char* type_name) {
  auto it = obj.find(key);
  if (it == obj.end() || it->type() != type) {
    throw UserError(fmt::format("tokenizer file '{}': field {} is missing or not {}", origin,
                                field, type_name));
  }
  return *it;
}

bool get_bool(const json& obj, const char* key, bool dflt) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  return it->get<bool>();
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    throw UserError(
        fmt::format("cannot open tokenizer file '{}': {}", path, std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw UserError(fmt::format("cannot read tokenizer file '{}'", path));
  return from_json_string(ss.str(), path);
}

BpeTokenizer BpeTokenizer::from_dir(const std::string& dir) {
  std::string d = dir;
  if (!d.empty() && d.back() != '/') d += '/';
  return from_file(d + "tokenizer.json");
}

BpeTokenizer BpeTokenizer::from_json_string(std::string_view text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw UserError(fmt::format(
        "tokenizer file '{}' is not valid JSON (truncated or corrupt?): syntax error at byte {}",
        origin, e.byte));
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    throw UserError(fmt::format("tokenizer file '{}' is not valid JSON: {}", origin, e.what()));
  }
  auto impl = std::make_shared<Impl>();
  Impl& m = *impl;
  m.source = origin;
  try {
    if (!j.is_object()) {
      throw UserError(fmt::format("tokenizer file '{}': top level is not a JSON object", origin));
    }
    for (const char* k : {"truncation", "padding"}) {
      if (j.contains(k) && !j[k].is_null()) {
        unsupported(origin, k, j[k], "null (qrun truncates and pads in its collators)");
      }
    }
    // ---- model
    const json& model = require(j, origin, "model", "model", json::value_t::object, "an object");
    {
      auto it = model.find("type");
      std::string type = (it != model.end() && it->is_string()) ? it->get<std::string>() : "";
      if (type != "BPE") {
        unsupported(origin, "model.type", it != model.end() ? *it : json(nullptr), "\"BPE\"");
      }
    }
    if (model.contains("dropout") && !model["dropout"].is_null()) {
      if (!(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
        unsupported(origin, "model.dropout", model["dropout"], "null");
      }
    }
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      unsupported(origin, "model.unk_token", model["unk_token"], "null (byte-level BPE)");
    }
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(k) && !model[k].is_null() &&
          !(model[k].is_string() && model[k].get<std::string>().empty())) {
        unsupported(origin, std::string("model.") + k, model[k], "null or \"\"");
      }
    }
    if (get_bool(model, "byte_fallback", false)) {
      unsupported(origin, "model.byte_fallback", model["byte_fallback"], "false");
    }
    m.ignore_merges = get_bool(model, "ignore_merges", false);
    const json& vocab =
        require(model, origin, "model.vocab", "vocab", json::value_t::object, "an object");
    int64_t max_id = -1;
    m.model_vocab.reserve(vocab.size() * 2);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() > INT32_MAX - 1) {
        throw UserError(fmt::format("tokenizer file '{}': model.vocab[{}] is not a valid id: {}",
                                    origin, json(it.key()).dump(), jdump(it.value())));
      }
      int64_t id = it.value().get<int64_t>();
      m.model_vocab[it.key()] = static_cast<int32_t>(id);
      max_id = std::max(max_id, id);
    }
    // ---- added tokens
    std::vector<AddedTok> added;
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      const json& at = j["added_tokens"];
      if (!at.is_array()) {
        throw UserError(
            fmt::format("tokenizer file '{}': field added_tokens is not an array", origin));
      }
      for (size_t i = 0; i < at.size(); ++i) {
        const json& t = at[i];
        std::string f = fmt::format("added_tokens[{}]", i);
        if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
            !t.contains("content") || !t["content"].is_string()) {
          throw UserError(fmt::format(
              "tokenizer file '{}': {} must be an object with integer id and string content",
              origin, f));
        }
        for (const char* k : {"single_word", "lstrip", "rstrip"}) {
          if (get_bool(t, k, false)) unsupported(origin, f + "." + k, t[k], "false");
        }
        AddedTok a;
        a.content = t["content"].get<std::string>();
        int64_t id = t["id"].get<int64_t>();
        if (id < 0 || id > INT32_MAX - 1) {
          throw UserError(fmt::format("tokenizer file '{}': {}.id {} is out of range", origin, f, id));
        }
        if (a.content.empty()) {
          throw UserError(fmt::format("tokenizer file '{}': {}.content is empty", origin, f));
        }
        a.id = static_cast<int32_t>(id);
        a.special = get_bool(t, "special", false);
        a.normalized = get_bool(t, "normalized", !a.special);
        max_id = std::max(max_id, id);
        added.push_back(std::move(a));
      }
    }
    // ---- normalizer
    auto parse_normalizer = [&](const json& n, const std::string& field, auto& self) -> void {
      if (n.is_null()) return;
      std::string type = n.is_object() && n.contains("type") && n["type"].is_string()
                             ? n["type"].get<std::string>()
                             : "";
      if (type == "NFC") {
        m.use_nfc = true;
      } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
        for (size_t i = 0; i < n["normalizers"].size(); ++i) {
          self(n["normalizers"][i], fmt::format("{}.normalizers[{}]", field, i), self);
        }
      } else {
        unsupported(origin, field + ".type", n.is_object() && n.contains("type") ? n["type"] : n,
                    "null, \"NFC\" or a Sequence of those");
      }
    };
    if (j.contains("normalizer")) parse_normalizer(j["normalizer"], "normalizer", parse_normalizer);
    // ---- pre-tokenizer
    bool byte_level_seen = false;
    auto parse_pre = [&](const json& pt, const std::string& field, auto& self) -> void {
      std::string type = pt.is_object() && pt.contains("type") && pt["type"].is_string()
                             ? pt["type"].get<std::string>()
                             : "";
      if (byte_level_seen) {
        unsupported(origin, field + ".type", pt.is_object() ? pt.value("type", json()) : pt,
                    "no pre-tokenizer after ByteLevel");
      }
      if (type == "Sequence" && pt.contains("pretokenizers") && pt["pretokenizers"].is_array()) {
        for (size_t i = 0; i < pt["pretokenizers"].size(); ++i) {
          self(pt["pretokenizers"][i], fmt::format("{}.pretokenizers[{}]", field, i), self);
        }
      } else if (type == "Split") {
        const json& pat = require(pt, origin, field + ".pattern", "pattern",
                                  json::value_t::object, "an object");
        std::string behavior = pt.value("behavior", std::string());
        if (behavior != "Isolated") {
          unsupported(origin, field + ".behavior", pt.value("behavior", json()), "\"Isolated\"");
        }
        if (get_bool(pt, "invert", false)) {
          unsupported(origin, field + ".invert", pt["invert"], "false");
        }
        if (pat.contains("Regex") && pat["Regex"].is_string()) {
          m.splits.push_back(std::make_unique<Regex>(pat["Regex"].get<std::string>(), false, origin));
        } else if (pat.contains("String") && pat["String"].is_string()) {
          m.splits.push_back(std::make_unique<Regex>(pat["String"].get<std::string>(), true, origin));
        } else {
          unsupported(origin, field + ".pattern", pat, "{\"Regex\": ...} or {\"String\": ...}");
        }
      } else if (type == "ByteLevel") {
        if (get_bool(pt, "add_prefix_space", false)) {
          unsupported(origin, field + ".add_prefix_space", pt["add_prefix_space"], "false");
        }
        if (get_bool(pt, "use_regex", true)) {
          m.splits.push_back(std::make_unique<Regex>(
              R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
              false, origin));
        }
        byte_level_seen = true;
      } else {
        unsupported(origin, field + ".type", pt.is_object() ? pt.value("type", json()) : pt,
                    "Split, ByteLevel or a Sequence of those");
      }
    };
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) {
      unsupported(origin, "pre_tokenizer", json(nullptr), "a ByteLevel pre-tokenizer");
    }
    parse_pre(j["pre_tokenizer"], "pre_tokenizer", parse_pre);
    if (!byte_level_seen) {
      unsupported(origin, "pre_tokenizer", j["pre_tokenizer"],
                  "a ByteLevel pre-tokenizer (possibly after Split steps)");
    }
    // ---- post-processor, decoder
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      const json& pp = j["post_processor"];
      if (!(pp.is_object() && pp.value("type", std::string()) == "ByteLevel")) {
        unsupported(origin, "post_processor.type", pp.is_object() ? pp.value("type", json()) : pp,
                    "null or \"ByteLevel\"");
      }
    }
    {
      const json* dec = j.contains("decoder") ? &j["decoder"] : nullptr;
      if (!dec || !dec->is_object() || dec->value("type", std::string()) != "ByteLevel") {
        unsupported(origin, "decoder.type",
                    dec && dec->is_object() ? dec->value("type", json()) : json(nullptr),
                    "\"ByteLevel\"");
      }
    }
    // ---- id tables: dense, indexed by id. Real vocabularies number their tokens densely (Qwen3:
    // 151,669 tokens, largest id 151,668), so a largest id far beyond the token count is a broken
    // (or hostile) file, and tables sized by it could take gigabytes: refuse it.
    const int64_t n_tokens = static_cast<int64_t>(vocab.size() + added.size());
    if (max_id >= n_tokens + kMaxUnusedIds) {
      throw UserError(fmt::format(
          "tokenizer file '{}': token ids reach {} for {} tokens; ids must be dense (qrun allows "
          "at most {} unused ids below the largest)",
          origin, max_id, n_tokens, kMaxUnusedIds));
    }
    const size_t n_ids = static_cast<size_t>(max_id + 1);
    m.spelling.assign(n_ids, std::string());
    m.dec_bytes.assign(n_ids, std::string());
    m.exists.assign(n_ids, 0);
    m.special.assign(n_ids, 0);
    auto dec_of = [](const std::string& sp) {
      auto b = spelling_to_bytes(sp);
      return b ? *b : sp;  // HF: a token with a non byte-level char decodes to its UTF-8 bytes
    };
    for (const auto& [sp, id] : m.model_vocab) {
      m.spelling[id] = sp;
      m.dec_bytes[id] = dec_of(sp);
      m.exists[id] = 1;
    }
    for (const auto& a : added) {
      m.spelling[a.id] = a.content;
      m.dec_bytes[a.id] = dec_of(a.content);
      m.exists[a.id] = 1;
      m.special[a.id] = a.special ? 1 : 0;
      m.added_vocab[a.content] = a.id;
    }
    {
      std::unordered_map<std::string, int32_t> all(m.model_vocab.begin(), m.model_vocab.end());
      for (const auto& a : added) all[a.content] = a.id;
      m.distinct = static_cast<int64_t>(all.size());
    }
    if (m.ignore_merges) {
      for (const auto& [sp, id] : m.model_vocab) {
        if (auto b = spelling_to_bytes(sp)) m.bytes_vocab.emplace(*b, id);
      }
    }
    // byte symbols
    const auto& bm = byte_map();
    for (int b = 0; b < 256; ++b) {
      std::string sym;
      append_utf8(sym, bm.byte_to_cp[b]);
      auto it = m.model_vocab.find(sym);
      if (it == m.model_vocab.end()) {
        throw UserError(fmt::format(
            "tokenizer file '{}': model.vocab lacks the byte-level symbol {} for byte 0x{:02X}; "
            "qrun supports byte-level BPE vocabularies that cover all 256 bytes",
            origin, json(sym).dump(), b));
      }
      m.byte_id[b] = it->second;
    }
    // merges
    const json& merges =
        require(model, origin, "model.merges", "merges", json::value_t::array, "an array");
    m.merges.build(merges.size());
    std::string joined;
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& mg = merges[r];
      std::string a, b;
      if (mg.is_string()) {
        const std::string& s = mg.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          throw UserError(fmt::format(
              "tokenizer file '{}': model.merges[{}] = {} is not two tokens separated by one "
              "space",
              origin, r, jdump(mg)));
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        throw UserError(fmt::format(
            "tokenizer file '{}': model.merges[{}] = {} is neither \"a b\" nor [\"a\", \"b\"]",
            origin, r, jdump(mg)));
      }
      auto ia = m.model_vocab.find(a), ib = m.model_vocab.find(b);
      joined = a + b;
      auto in = m.model_vocab.find(joined);
      if (ia == m.model_vocab.end() || ib == m.model_vocab.end() || in == m.model_vocab.end()) {
        throw UserError(fmt::format(
            "tokenizer file '{}': model.merges[{}] = {} uses a token that is not in model.vocab",
            origin, r, jdump(mg)));
      }
      m.merges.insert(ia->second, ib->second, static_cast<int32_t>(r), in->second);
    }
    // added-token matchers (longest first within a first byte)
    m.added = std::move(added);
    for (uint32_t k = 0; k < m.added.size(); ++k) {
      AddedTok& a = m.added[k];
      if (a.normalized) {
        if (m.use_nfc) {
          std::string out;
          if (nfc(a.content, out)) a.content = out;
        }
      }
      AddedMatcher& mt = a.normalized ? m.norm_matcher : m.raw_matcher;
      mt.by_first[static_cast<unsigned char>(a.content[0])].push_back(k);
      mt.any = true;
    }
    for (AddedMatcher* mt : {&m.raw_matcher, &m.norm_matcher}) {
      for (auto& v : mt->by_first) {
        std::stable_sort(v.begin(), v.end(), [&](uint32_t x, uint32_t y) {
          return m.added[x].content.size() > m.added[y].content.size();
        });
      }
    }
  } catch (const json::exception& e) {
    throw UserError(fmt::format("tokenizer file '{}': malformed: {}", origin, e.what()));
  }
  return BpeTokenizer(std::move(impl));
}

// ------------------------------------------------------------------------------------------------
// Public API

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, parse_special, ids, nullptr);
  return ids;
}

void BpeTokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids,
                               std::vector<TokenSpan>* spans, bool parse_special) const {
  impl_->encode(text, parse_special, ids, spans);
}

std::vector<std::vector<int32_t>> BpeTokenizer::encode_batch(const std::vector<std::string>& texts,
                                                             int num_threads,
                                                             bool parse_special) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  size_t nt = static_cast<size_t>(std::max(1, num_threads));
  nt = std::min(nt, std::max<size_t>(1, texts.size()));
  if (nt <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i], parse_special);
    return out;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(nt);
  for (size_t t = 0; t < nt; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (size_t i = t; i < texts.size(); i += nt) out[i] = encode(texts[i], parse_special);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.exists.size() || !m.exists[id]) {
      throw UserError(fmt::format("cannot decode token id {}: not in the vocabulary of '{}'", id,
                                  m.source));
    }
    if (skip_special && m.special[id]) continue;
    bytes += m.dec_bytes[id];
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_vocab.find(token); it != impl_->added_vocab.end()) return it->second;
  if (auto it = impl_->model_vocab.find(token); it != impl_->model_vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->exists.size() || !impl_->exists[id]) {
    return std::nullopt;
  }
  return impl_->spelling[id];
}

std::string_view BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->exists.size()) return {};
  return impl_->dec_bytes[id];
}

int64_t BpeTokenizer::vocab_size() const { return impl_->distinct; }
int64_t BpeTokenizer::id_end() const { return static_cast<int64_t>(impl_->exists.size()); }
bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
const std::string& BpeTokenizer::source() const { return impl_->source; }

size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    size_t len = utf8_seq(p + i, n - i, &bad);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  size_t first = first_invalid_utf8(s);
  if (first == std::string_view::npos) return std::string(s);
  std::string out(s.substr(0, first));
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = first;
  while (i < n) {
    size_t bad = 0;
    size_t len = utf8_seq(p + i, n - i, &bad);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace qrun::tok
