// tests/model/test_safetensors.cpp - the safetensors header parser on malformed input: every
// problem is a UserError that names the file (and the tensor, when there is one).
#include "safetensors.h"

#include <qrun/sdk/error.h>

#include <gtest/gtest.h>

#include <string>

using qrun::safetensors::parse_header;

namespace {

std::string file_with(const std::string& hdr, size_t data_bytes) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((hdr.size() >> (8 * i)) & 0xff);
  return b + hdr + std::string(data_bytes, '\0');
}

std::string error_of(const std::string& bytes) {
  try {
    parse_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f.safetensors");
  } catch (const qrun::UserError& e) {
    return e.message();
  }
  return "no error";
}

TEST(Safetensors, ParsesValidHeader) {
  std::string b = file_with(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12);
  auto h = parse_header(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "f");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.find("b")->dtype, "BF16");
}

TEST(Safetensors, RejectsMalformedHeaders) {
  EXPECT_EQ(error_of("abc"), "safetensors file f.safetensors: truncated (3 bytes; a header needs at least 8)");
  std::string huge(8, '\xff');
  EXPECT_EQ(error_of(huge), "safetensors file f.safetensors: header length 18446744073709551615 "
                            "exceeds the 100 MiB limit");
  std::string b = file_with("{}", 0);
  b[0] = 50;
  EXPECT_EQ(error_of(b), "safetensors file f.safetensors: truncated: header says 50 bytes of JSON but "
                         "the file has only 2 bytes after the length field");
  EXPECT_EQ(error_of(file_with("{\"a\":", 0)), "safetensors file f.safetensors: header is not valid JSON");
  EXPECT_EQ(error_of(file_with("[]", 0)), "safetensors file f.safetensors: header is not a JSON object");
  EXPECT_EQ(error_of(file_with(std::string(100, '[') + std::string(100, ']'), 0)),
            "safetensors file f.safetensors: header JSON nested too deeply");
  EXPECT_EQ(error_of(file_with(R"({"t":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}})", 1)),
            "safetensors file f.safetensors: tensor 't' has unknown dtype 'Q9'");
  EXPECT_EQ(error_of(file_with(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
            "safetensors file f.safetensors: tensor 't' has an invalid dimension in its shape");
  EXPECT_EQ(error_of(file_with(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4)),
            "safetensors file f.safetensors: tensor 't' has data_offsets [4, 0] with begin > end");
  EXPECT_EQ(error_of(file_with(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)),
            "safetensors file f.safetensors: tensor 't' data_offsets [0, 8] run past the end of the "
            "data (4 bytes): the file is truncated or its header lies");
  EXPECT_EQ(error_of(file_with(R"({"t":{"dtype":"F32","shape":[1099511627776,1099511627776,1099511627776],"data_offsets":[0,8]}})", 8)),
            "safetensors file f.safetensors: tensor 't' shape is too large");
  EXPECT_EQ(error_of(file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
            "safetensors file f.safetensors: tensors 'a' and 'b' overlap (bytes [0, 8) and [4, 8))");
  EXPECT_EQ(error_of(file_with(R"({"t":{"dtype":"F32","shape":[1]}})", 4)),
            "safetensors file f.safetensors: tensor 't' has no valid data_offsets [begin, end]");
}

}  // namespace
