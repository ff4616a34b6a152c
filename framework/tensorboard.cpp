// framework/tensorboard.cpp - see tensorboard.h.
//
// Note [Hand-encoded protobuf]
// The file holds two message types only, tensorflow.Event and tensorflow.Summary(.Value), and we
// write four of their fields (wall_time, step, file_version, summary{value{tag, simple_value}}).
// Hand-encoding those few fields (varints, fixed64/fixed32, length-delimited) is ~40 lines, while
// generated protobuf code would bring a protobuf runtime and .proto files into the host for
// nothing else. The encoding is checked against tensorboard's own reader in
// tests/trainer/check_tensorboard.py. CRC32C comes from Boost.CRC, not hand-rolled.
#include "tensorboard.h"

#include <qrun/sdk/error.h>

#include <boost/crc.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace fs = std::filesystem;

namespace qrun {
namespace {

// CRC-32C (Castagnoli, polynomial 0x1EDC6F41), reflected in and out, as TFRecord uses.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
void put_key(std::string& out, int field, int wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5.
std::string event_header(int64_t step) {
  std::string e;
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  uint64_t bits;
  std::memcpy(&bits, &now, sizeof bits);
  put_key(e, 1, 1);
  put_fixed(e, bits, 8);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

uint32_t tfrecord_masked_crc32c(const void* data, size_t size) {
  Crc32c crc;
  crc.process_bytes(data, size);
  uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  long secs = static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count());
  path_ = dir / fmt::format("events.out.tfevents.{}.{}.{}", secs, host, ::getpid());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  QRUN_CHECK(fd_ >= 0, "cannot create the TensorBoard event file {}: {}", path_.string(), errno_text(errno));
  std::string e = event_header(0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);  // nothing is buffered: every record was written already
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  // tensorflow.Summary: repeated Value value = 1; Value: tag = 1 (string), simple_value = 2 (float).
  std::string summary;
  for (const auto& [tag, v] : scalars) {
    std::string value;
    put_bytes(value, 1, tag);
    float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    put_key(value, 2, 5);
    put_fixed(value, bits, 4);
    put_bytes(summary, 1, value);
  }
  std::string e = event_header(step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& payload) {
  // TFRecord: uint64 length, uint32 masked crc(length), payload, uint32 masked crc(payload); all
  // little-endian. One write(2) per record, so a record is never split by a crash between calls.
  std::string rec;
  put_fixed(rec, payload.size(), 8);
  put_fixed(rec, tfrecord_masked_crc32c(rec.data(), 8), 4);
  rec += payload;
  put_fixed(rec, tfrecord_masked_crc32c(payload.data(), payload.size()), 4);
  const char* p = rec.data();
  size_t left = rec.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    QRUN_CHECK(n > 0, "cannot write the TensorBoard event file {}: {}", path_.string(),
               n < 0 ? errno_text(errno) : std::string("no progress"));
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace qrun
