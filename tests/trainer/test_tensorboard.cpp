// tests/trainer/test_tensorboard.cpp - the TFRecord framing of framework/tensorboard.cpp: the
// masked CRC32C against the published check value, and the exact bytes of a file's first record.
// (check_tensorboard.py reads whole runs back with tensorboard's own reader.)
#include "tensorboard.h"

#include "support/run_process.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace {

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

TEST(TensorBoard, MaskedCrc32cMatchesTheCheckValue) {
  // CRC-32C("123456789") = 0xE3069283 (the Castagnoli check value), then TFRecord's mask.
  EXPECT_EQ(qrun::tfrecord_masked_crc32c("123456789", 9), mask(0xE3069283u));
  EXPECT_EQ(qrun::tfrecord_masked_crc32c("", 0), mask(0u));
}

TEST(TensorBoard, FirstRecordIsTheFileVersionAndRecordsAreFramed) {
  fs::path dir = fs::path(WORK_DIR) / "tb-unit";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path file;
  {
    qrun::TensorBoardWriter w(dir);
    file = w.path();
    w.add_scalars(7, {{"train/loss", 1.5}});
  }
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u) << file;
  std::string bytes = qrun::test::slurp(file.string());
  size_t at = 0;
  int records = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t len;
    std::memcpy(&len, bytes.data() + at, 8);
    EXPECT_EQ(u32_at(bytes, at + 8), qrun::tfrecord_masked_crc32c(bytes.data() + at, 8));
    ASSERT_LE(at + 12 + len + 4, bytes.size());
    std::string payload = bytes.substr(at + 12, len);
    EXPECT_EQ(u32_at(bytes, at + 12 + len), qrun::tfrecord_masked_crc32c(payload.data(), payload.size()));
    if (records == 0) EXPECT_NE(payload.find("brain.Event:2"), std::string::npos);
    if (records == 1) {
      EXPECT_NE(payload.find("train/loss"), std::string::npos);
      float f = 1.5f;
      EXPECT_NE(payload.find(std::string(reinterpret_cast<const char*>(&f), 4)), std::string::npos);
    }
    at += 12 + len + 4;
    records++;
  }
  EXPECT_EQ(records, 2);
}

}  // namespace
