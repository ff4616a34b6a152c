// framework/tensorboard.h - TensorBoard event files, written without TensorFlow or protobuf.
//
// A run's scalars (loss, learning rate, eval loss, ...) go to
// <run.dir>/events.out.tfevents.<unix seconds>.<host>.<pid>, a TFRecord file of tensorflow.Event
// messages that TensorBoard (and tensorboard's EventAccumulator) reads: the first record carries
// file_version "brain.Event:2", each later one a Summary of simple_value scalars for one step.
// Every add_scalars() call reaches the kernel with write(2) before it returns, so a run that
// crashes keeps all the events of its finished steps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace qrun {

class TensorBoardWriter {
 public:
  // Creates a new event file in `dir` (which must exist). Throws UserError if it cannot.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` holding every (tag, value) pair as a simple_value. Throws UserError
  // naming the file and the errno text when the write fails.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::filesystem::path path_;
  int fd_ = -1;
};

// Exposed for the unit test: the masked CRC32C of TFRecord framing.
uint32_t tfrecord_masked_crc32c(const void* data, size_t size);

}  // namespace qrun
