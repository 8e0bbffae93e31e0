#include <dkit/checkpoint/safetensors.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/device/device.h>
#include <dkit/model/mlp_file.h>

#include "../support.h"
#include "python.h"

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <optional>

namespace dkit {
namespace {

using test::error_message;
using test::fixture;
using test::read_file;
using test::read_rows;
using test::write_bytes;

// A safetensors file from its parts: the 8-byte header length (`length`, the header's own by default), the
// header and the data.
std::string craft(const std::string& header, const std::string& data = "", std::optional<uint64_t> length = {}) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) {
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  return out + header + data;
}

// The header of a file as written: the JSON without the length before it and the data after it.
std::string header_of(const std::string& file) {
  uint64_t n = 0;
  for (size_t i = 0; i < 8; ++i) {
    n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  }
  return file.substr(8, n);
}

// The tensors of tests/fixtures/dtypes.safetensors, computed as make_safetensors_fixtures.py computes them.
StateDict dtype_tensors() {
  const auto base = torch::arange(-6, 6).reshape({3, 4});
  StateDict tensors("state dict key");
  tensors.insert("f64", base.to(torch::kDouble) / 4);
  tensors.insert("f32", base.to(torch::kFloat) / 4);
  tensors.insert("f16", base.to(torch::kHalf) / 4);
  tensors.insert("bf16", base.to(torch::kBFloat16) / 4);
  tensors.insert("i64", base * 1'000'000'007);
  tensors.insert("i32", (base * 100'003).to(torch::kInt));
  tensors.insert("i16", (base * 1'009).to(torch::kShort));
  tensors.insert("i8", (base * 10).to(torch::kChar));
  tensors.insert("u8", torch::arange(0, 240, 20).reshape({3, 4}).to(torch::kByte));
  tensors.insert("bool", (torch::arange(12) % 3 == 0).reshape({3, 4}));
  tensors.insert("scalar", torch::full({}, 2.5, torch::kFloat));
  tensors.insert("empty", torch::zeros({0, 3}));
  return tensors;
}

void expect_same(const StateDict& actual, const StateDict& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& item : expected) {
    const at::Tensor* found = actual.find(item.key());
    ASSERT_NE(found, nullptr) << item.key();
    EXPECT_EQ(found->scalar_type(), item.value().scalar_type()) << item.key();
    EXPECT_EQ(found->sizes(), item.value().sizes()) << item.key();
    EXPECT_TRUE(torch::equal(*found, item.value())) << item.key();
  }
}

class SafetensorsTest : public test::SeedingFixture {
 protected:
  // Reads `bytes` as a file named bad.safetensors and returns the error.
  std::string read_error(const std::string& bytes, const ReadLimits& limits = {}) {
    write_bytes(path_, bytes);
    return error_message([&] { read_safetensors(path_, ReadOptions().limits(limits)); });
  }

  test::TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(SafetensorsTest, ReadsWhatPythonWrote) {
  const SafetensorsFile file = read_safetensors(fixture("dtypes.safetensors"));
  expect_same(file.tensors, dtype_tensors());
  EXPECT_EQ(file.metadata, (SafetensorsMetadata{{"format", "pt"}}));
  EXPECT_EQ(read_safetensors(fixture("normalized_mlp.safetensors")).metadata,
            (SafetensorsMetadata{{"format", "pt"}, {"note", "state_dict.pt with input normalisation"}}));
}

// A mapped file gives the tensors a read gives, as views of one mapping of the file, checked the same way.
TEST_F(SafetensorsTest, MapsWhatPythonWroteAsViewsOfTheFile) {
  const SafetensorsFile mapped = map_safetensors(fixture("dtypes.safetensors"));
  expect_same(mapped.tensors, dtype_tensors());
  EXPECT_EQ(mapped.metadata, (SafetensorsMetadata{{"format", "pt"}}));
  const auto* f32 = static_cast<const char*>(mapped.tensors["f32"].data_ptr());
  const auto* f64 = static_cast<const char*>(mapped.tensors["f64"].data_ptr());
  EXPECT_LT(std::abs(f32 - f64), 4096);
  write_bytes(path_, read_file(fixture("dtypes.safetensors")).substr(0, 200));
  EXPECT_EQ(error_message([&] { map_safetensors(path_); }), read_error(read_file(path_)));
  EXPECT_EQ(error_message([] { map_safetensors(fixture("dtypes.safetensors"), ReadOptions().map_location(torch::kCUDA)); }),
            fixture("dtypes.safetensors") + ": a mapped safetensors file stays on the CPU, not cuda");
}

TEST_F(SafetensorsTest, OrdersTensorsByNameWithNumbersComparedAsNumbers) {
  EXPECT_EQ(read_safetensors(fixture("dtypes.safetensors")).tensors.keys(),
            (std::vector<std::string>{"bf16", "bool", "empty", "f16", "f32", "f64", "i8", "i16", "i32", "i64",
                                      "scalar", "u8"}));
  EXPECT_EQ(read_safetensors(fixture("deep_mlp.safetensors")).tensors.keys(),
            (std::vector<std::string>{"0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight", "6.bias",
                                      "6.weight", "8.bias", "8.weight", "10.bias", "10.weight"}));
  StateDict tensors("state dict key");
  for (const std::string name : {"layer.10.w", "layer.9.w", "layer.09.w", "layer.1.w", "layer.1.v", "a", "layer"}) {
    tensors.insert(name, torch::zeros({1}));
  }
  write_safetensors(dir_.file("names.safetensors"), tensors);
  EXPECT_EQ(read_safetensors(dir_.file("names.safetensors")).tensors.keys(),
            (std::vector<std::string>{"a", "layer", "layer.1.v", "layer.1.w", "layer.09.w", "layer.9.w",
                                      "layer.10.w"}));
}

TEST_F(SafetensorsTest, WritesWhatPythonWrites) {
  for (const auto& [name, tensors, metadata] :
       std::vector<std::tuple<std::string, StateDict, SafetensorsMetadata>>{
           {"dtypes.safetensors", dtype_tensors(), {{"format", "pt"}}},
           {"seed_model.safetensors", read_state_dict(fixture("seed_model.pt")), {}},
           {"deep_mlp.safetensors", read_safetensors(fixture("deep_mlp.safetensors")).tensors, {}}}) {
    write_safetensors(dir_.file(name), tensors, metadata);
    EXPECT_EQ(read_file(dir_.file(name)), read_file(fixture(name))) << name;
  }
}

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  StateDict tensors("state dict key");
  for (const auto& [dtype, name] : kSafetensorsDtypes) {
    at::Tensor values;
    if (dtype == torch::kBool) {
      values = torch::rand({5, 7}) > 0.5;
    } else if (c10::isFloatingType(dtype)) {
      values = torch::randn({5, 7}).to(dtype);
    } else {
      values = torch::randint(dtype == torch::kByte ? 0 : -100, 100, {5, 7}).to(dtype);
    }
    tensors.insert(std::string(name), values);
  }
  const std::string path = dir_.file("dtypes.safetensors");
  write_safetensors(path, tensors);
  expect_same(read_safetensors(path).tensors, tensors);
  for (const auto& [dtype, name] : kSafetensorsDtypes) {
    EXPECT_NE(header_of(read_file(path)).find("\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(name)),
              std::string::npos)
        << name;
  }
}

TEST_F(SafetensorsTest, RoundTripsZeroDimAndEmptyTensors) {
  StateDict tensors("state dict key");
  tensors.insert("scalar", torch::full({}, 7, torch::kLong));
  tensors.insert("half_scalar", torch::full({}, -0.5, torch::kHalf));
  tensors.insert("empty", torch::zeros({0}));
  tensors.insert("empty_rows", torch::zeros({0, 3}, torch::kDouble));
  tensors.insert("empty_middle", torch::zeros({2, 0, 4}, torch::kBool));
  const std::string path = dir_.file("shapes.safetensors");
  write_safetensors(path, tensors);
  const SafetensorsFile file = read_safetensors(path);
  expect_same(file.tensors, tensors);
  EXPECT_EQ(file.tensors["scalar"].dim(), 0);
  EXPECT_EQ(file.tensors["scalar"].item<int64_t>(), 7);
  EXPECT_EQ(file.tensors["empty_middle"].sizes(), (std::vector<int64_t>{2, 0, 4}));
  EXPECT_NE(header_of(read_file(path)).find("\"scalar\":{\"dtype\":\"I64\",\"shape\":[],"), std::string::npos);
}

TEST_F(SafetensorsTest, RoundTripsMetadataAndLeavesItOutWhenEmpty) {
  const SafetensorsMetadata metadata = {{"format", "pt"},
                                        {"quoted \"key\"", "line\nbreak\tand \\ backslash"},
                                        {"unicode", "gr\xc3\xb6\xc3\x9f" "e \xe2\x9c\x93"},
                                        {"control", std::string("\x01\x1f", 2)},
                                        {"empty", ""}};
  StateDict tensors("state dict key");
  tensors.insert("w", torch::ones({2}));
  const std::string path = dir_.file("meta.safetensors");
  write_safetensors(path, tensors, metadata);
  EXPECT_EQ(read_safetensors(path).metadata, metadata);
  EXPECT_EQ(header_of(read_file(path)).rfind("{\"__metadata__\":{\"control\":\"\\u0001\\u001f\",", 0), 0u)
      << header_of(read_file(path));

  write_safetensors(path, tensors);
  EXPECT_TRUE(read_safetensors(path).metadata.empty());
  EXPECT_EQ(header_of(read_file(path)), "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ");

  write_safetensors(path, StateDict("state dict key"));
  EXPECT_EQ(read_file(path), craft("{}      "));
  EXPECT_TRUE(read_safetensors(path).tensors.is_empty());
}

TEST_F(SafetensorsTest, WritesViewsOfOneStorageAsCopiesOfTheirValues) {
  const auto weight = torch::arange(12, torch::kFloat).reshape({3, 4});
  StateDict tensors("state dict key");
  tensors.insert("weight", weight);
  tensors.insert("transposed", weight.t());
  tensors.insert("row", weight[1]);
  tensors.insert("column", weight.select(1, 2));
  tensors.insert("overlapping", weight.as_strided({3, 3}, {1, 1}, 2));
  tensors.insert("expanded", torch::ones({1}).expand({5}));
  tensors.insert("parameter", torch::ones({2}).requires_grad_());
  const std::string path = dir_.file("views.safetensors");
  write_safetensors(path, tensors);
  const SafetensorsFile file = read_safetensors(path);
  expect_same(file.tensors, tensors);
  EXPECT_TRUE(file.tensors["transposed"].is_contiguous());
  EXPECT_NE(file.tensors["row"].data_ptr(), file.tensors["weight"].data_ptr());
  int64_t bytes = 0;
  for (const auto& item : tensors) {
    bytes += item.value().numel() * item.value().element_size();
  }
  const std::string written = read_file(path);
  EXPECT_EQ(static_cast<int64_t>(written.size()), 8 + static_cast<int64_t>(header_of(written).size()) + bytes);
}

TEST_F(SafetensorsTest, ReadsFromMemoryAsFromAFile) {
  const std::string bytes = read_file(fixture("dtypes.safetensors"));
  const SafetensorsFile file = read_safetensors_bytes(bytes, "in memory");
  expect_same(file.tensors, dtype_tensors());
  EXPECT_EQ(file.metadata, read_safetensors(fixture("dtypes.safetensors")).metadata);
  EXPECT_EQ(error_message([&] { read_safetensors_bytes(bytes.substr(0, 100), "in memory"); }),
            "in memory: the header length is 768 bytes but only 92 bytes follow it (the file may have been cut "
            "short)");
}

TEST_F(SafetensorsTest, RefusesAnUnavailableMapLocation) {
  if (num_gpus() > 0) {
    GTEST_SKIP() << "a GPU is visible: cuda:0 is available";
  }
  const std::string path = fixture("dtypes.safetensors");
  EXPECT_EQ(error_message([&] { read_safetensors(path, ReadOptions().map_location(gpu(0))); }),
            path + ": cannot load to cuda:0: it is not available here (available: cpu)");
}

TEST_F(SafetensorsTest, LoadsToTheGpu_CUDA) {
  const SafetensorsFile file = read_safetensors(fixture("dtypes.safetensors"), ReadOptions().map_location(gpu(0)));
  for (const auto& item : file.tensors) {
    EXPECT_EQ(item.value().device(), gpu(0)) << item.key();
  }
  StateDict back("state dict key");
  for (const auto& item : file.tensors) {
    back.insert(item.key(), item.value().cpu());
  }
  expect_same(back, dtype_tensors());
}

TEST_F(SafetensorsTest, WritesFromTheGpu_CUDA) {
  StateDict tensors("state dict key");
  tensors.insert("w", torch::randn({5, 3}, torch::Device(torch::kCUDA, 0)));
  tensors.insert("t", tensors["w"].t());
  write_safetensors(dir_.file("gpu.safetensors"), tensors);
  const SafetensorsFile file = read_safetensors(dir_.file("gpu.safetensors"));
  EXPECT_EQ(file.tensors["w"].device(), cpu());
  EXPECT_TRUE(torch::equal(file.tensors["w"], tensors["w"].cpu()));
  EXPECT_TRUE(torch::equal(file.tensors["t"], tensors["w"].cpu().t()));
}

// Malformed files: each is one line naming the file and the problem.

TEST_F(SafetensorsTest, ExplainsAMissingEmptyOrShortFile) {
  EXPECT_EQ(error_message([&] { read_safetensors(dir_.file("missing.safetensors")); }),
            dir_.file("missing.safetensors") + ": cannot open: No such file or directory");
  EXPECT_EQ(read_error(""), path_ + ": the file is empty");
  EXPECT_EQ(read_error(std::string("\x02\0\0\0\0", 5)),
            path_ + ": the file is 5 bytes, too short for a safetensors file, which starts with an 8-byte header "
                    "length");
}

TEST_F(SafetensorsTest, ExplainsAHeaderLengthPastTheFile) {
  EXPECT_EQ(read_error(craft("{}", "", 1000)),
            path_ + ": the header length is 1000 bytes but only 2 bytes follow it (the file may have been cut short)");
  EXPECT_EQ(read_error(craft("{}", "", ~uint64_t{1})),
            path_ + ": the header length is 18446744073709551614 bytes but only 2 bytes follow it (the file may "
                    "have been cut short)");
  const std::string whole = read_file(fixture("dtypes.safetensors"));
  EXPECT_EQ(read_error(whole.substr(0, whole.size() - 1)),
            path_ + ": tensor 'bool' has data_offsets [388, 400], past the end of the data (399 bytes after the "
                    "header; the file may have been cut short)");
}

TEST_F(SafetensorsTest, SaysWhenAFileIsNotSafetensorsAtAll) {
  const std::string not_safetensors = path_ + ": not a safetensors file: it does not start with an 8-byte header "
                                              "length and a JSON object";
  EXPECT_EQ(read_error("label,pixel0\n3,0\n"), not_safetensors);
  EXPECT_EQ(read_error(craft("[]", "", 1000)), not_safetensors);
  EXPECT_EQ(read_error(std::string(64, '\xff')), not_safetensors);
}

TEST_F(SafetensorsTest, ExplainsAHeaderThatIsNotAJsonObject) {
  EXPECT_EQ(read_error(craft("[1]")),
            path_ + ": the header does not start with '{': a safetensors header is a JSON object");
  EXPECT_EQ(read_error(craft(" {}")),
            path_ + ": the header does not start with '{': a safetensors header is a JSON object");
  EXPECT_EQ(read_error(craft("")),
            path_ + ": the header does not start with '{': a safetensors header is a JSON object");
  EXPECT_EQ(read_error(craft("{\"a\": ")), path_ + ": the header is not valid UTF-8 JSON: it ends inside a value");
  EXPECT_EQ(read_error(craft("{\"a\": nope}")),
            path_ + ": the header is not valid UTF-8 JSON: parsing stops at byte 8 of 11");
  EXPECT_EQ(read_error(craft("{\"\xff\": {}}")),
            path_ + ": the header is not valid UTF-8 JSON: parsing stops at byte 3 of 9");
  EXPECT_EQ(read_error(craft("{} x")), path_ + ": the header is not valid UTF-8 JSON: parsing stops at byte 4 of 4");
  EXPECT_EQ(read_error(craft("{\"a\": 1e999}")),
            path_ + ": the header is not valid JSON: it holds a number out of range");
}

TEST_F(SafetensorsTest, ExplainsEntriesThatAreNotTensors) {
  EXPECT_EQ(read_error(craft("{\"a\": 1}")),
            path_ + ": tensor 'a' is an integer in the header, not an object with dtype, shape and data_offsets");
  EXPECT_EQ(read_error(craft("{\"a\": {\"shape\": [], \"data_offsets\": [0, 4]}}")),
            path_ + ": tensor 'a' has no dtype");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": 32}}")),
            path_ + ": tensor 'a' has a dtype that is an integer, not a string");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}")),
            path_ + ": tensor 'a' has no shape");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": 4}}")),
            path_ + ": tensor 'a' has a shape that is an integer, not a list of sizes");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": [2, -1]}}")),
            path_ + ": tensor 'a' has a shape with a size that is a negative integer, not a non-negative integer");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": [2.0]}}")),
            path_ + ": tensor 'a' has a shape with a size that is a float, not a non-negative integer");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": []}}")),
            path_ + ": tensor 'a' has no data_offsets");
  for (const std::string offsets : {"[0]", "[0, 4, 8]", "[0, \"4\"]", "{}", "[-4, 0]"}) {
    EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": " + offsets + "}}")),
              path_ + ": tensor 'a' has data_offsets that are not two non-negative integers [begin, end]")
        << offsets;
  }
  EXPECT_EQ(read_error(craft("{\"__metadata__\": [\"pt\"]}")),
            path_ + ": __metadata__ is a list, not an object of strings to strings");
  EXPECT_EQ(read_error(craft("{\"__metadata__\": {\"format\": \"pt\", \"epoch\": 3}}")),
            path_ + ": __metadata__ 'epoch' is an integer, not a string (metadata values are strings)");
}

TEST_F(SafetensorsTest, ExplainsADtypeItDoesNotRead) {
  const std::string reads = "(it reads I64, F64, F32, I32, BF16, F16, I16, I8, U8 and BOOL)";
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"Q7\", \"shape\": [], \"data_offsets\": [0, 1]}}")),
            path_ + ": tensor 'a' has dtype 'Q7', which dkit does not read " + reads);
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"U16\", \"shape\": [], \"data_offsets\": [0, 2]}}")),
            path_ + ": tensor 'a' has dtype 'U16', which dkit does not read " + reads);
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"f32\", \"shape\": [], \"data_offsets\": [0, 4]}}")),
            path_ + ": tensor 'a' has dtype 'f32', which dkit does not read " + reads);
}

TEST_F(SafetensorsTest, ExplainsOffsetsThatOverlapLeaveAHoleOrMissTheShape) {
  const auto two = [](const std::string& a, const std::string& b) {
    return craft("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": " + a +
                     "}, \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": " + b + "}}",
                 std::string(40, '\0'));
  };
  EXPECT_EQ(read_error(two("[0, 16]", "[8, 24]")),
            path_ + ": tensor 'b' has data_offsets [8, 24], which overlap those of tensor 'a' [0, 16]");
  EXPECT_EQ(read_error(two("[0, 16]", "[0, 16]")),
            path_ + ": tensor 'b' has data_offsets [0, 16], which overlap those of tensor 'a' [0, 16]");
  EXPECT_EQ(read_error(two("[0, 16]", "[20, 36]")),
            path_ + ": tensor 'b' has data_offsets [20, 36], but tensor 'a' ends at 16: bytes 16 to 20 of the data "
                    "belong to no tensor");
  EXPECT_EQ(read_error(two("[24, 40]", "[4, 20]")),
            path_ + ": tensor 'b' has data_offsets [4, 20]: bytes 0 to 4 of the data belong to no tensor");
  EXPECT_EQ(read_error(two("[0, 16]", "[16, 12]")),
            path_ + ": tensor 'b' has data_offsets [16, 12], which end before they begin");
  EXPECT_EQ(read_error(two("[0, 16]", "[16, 44]")),
            path_ + ": tensor 'b' has data_offsets [16, 44], past the end of the data (40 bytes after the header; the "
                    "file may have been cut short)");
  EXPECT_EQ(read_error(two("[0, 16]", "[16, 36]")),
            path_ + ": tensor 'b' has data_offsets [16, 36], 20 bytes, but shape [4] of F32 needs 16 bytes");
  EXPECT_EQ(read_error(two("[0, 16]", "[16, 32]")),
            path_ + ": the tensors' data ends at byte 32 of the 40 after the header: the last 8 bytes belong to no "
                    "tensor");
  EXPECT_EQ(read_error(two("[0, 20]", "[20, 36]")),
            path_ + ": tensor 'a' has data_offsets [0, 20], 20 bytes, but shape [4] of F32 needs 16 bytes");
}

TEST_F(SafetensorsTest, ExplainsAShapeWhoseSizeOverflows) {
  for (const std::string shape : {"[4294967296, 4294967296]", "[2305843009213693952]", "[18446744073709551615, 0]",
                                  "[0, 4294967296, 4294967296]"}) {
    EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": " + shape + ", \"data_offsets\": [0, 0]}}")),
              path_ + ": tensor 'a' has shape " + shape + ", whose size overflows 64 bits")
        << shape;
  }
}

TEST_F(SafetensorsTest, ExplainsANameGivenTwice) {
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}, "
                             "\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [4, 8]}}",
                             std::string(8, '\0'))),
            path_ + ": the header names 'a' twice");
  EXPECT_EQ(read_error(craft("{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F64\", \"shape\": [], "
                             "\"data_offsets\": [0, 4]}}",
                             std::string(4, '\0'))),
            path_ + ": the header has the key 'dtype' twice in 'a'");
  EXPECT_EQ(read_error(craft("{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}")),
            path_ + ": the header has the key 'k' twice in '__metadata__'");
}

TEST_F(SafetensorsTest, RefusesBooleansOtherThanZeroAndOne) {
  EXPECT_EQ(read_error(craft("{\"m\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [0, 3]}}",
                             std::string("\x01\x00\x02", 3))),
            path_ + ": tensor 'm' of dtype BOOL holds the byte 2 at element 2: a BOOL is 0 or 1");
}

TEST_F(SafetensorsTest, AppliesTheReadLimits) {
  const std::string path = fixture("dtypes.safetensors");
  const auto read = [&](const ReadLimits& limits) {
    return error_message([&] { read_safetensors(path, ReadOptions().limits(limits)); });
  };
  EXPECT_EQ(read(ReadLimits().max_file_bytes(1000)),
            path + ": the file is 1176 bytes, more than the limit of 1000 (max_file_bytes)");
  EXPECT_EQ(read(ReadLimits().max_header_bytes(700)),
            path + ": the header is 768 bytes, more than the limit of 700 (max_header_bytes)");
  EXPECT_EQ(read(ReadLimits().max_records(11)),
            path + ": the header lists 12 tensors, more than the limit of 11 (max_records)");
  EXPECT_EQ(read(ReadLimits().max_record_bytes(90)),
            path + ": tensor 'i64' is 96 bytes, more than the limit of 90 (max_record_bytes)");
  EXPECT_EQ(read(ReadLimits().max_depth(2)), path + ": the header nests deeper than 2 levels (max_depth)");
  EXPECT_EQ(read(ReadLimits().max_values(50)), path + ": the header holds more than 50 JSON values (max_values)");
  EXPECT_EQ(read_error(craft(std::string(200, '[') + std::string(200, ']'))),
            path_ + ": the header does not start with '{': a safetensors header is a JSON object");
  EXPECT_EQ(read_error(craft("{\"a\": " + std::string(200, '[') + std::string(200, ']') + "}")),
            path_ + ": the header nests deeper than 100 levels (max_depth)");
  // A sparse file, so that the header length fits it without writing 100 MB.
  write_bytes(path_, craft("{}", "", 100'000'001));
  std::filesystem::resize_file(path_, 8 + 100'000'001);
  EXPECT_EQ(error_message([&] { read_safetensors(path_); }),
            path_ + ": the header is 100000001 bytes, more than the limit of 100000000 (max_header_bytes)");
}

TEST_F(SafetensorsTest, NamesTheFormatAFileOfTheOtherKindIsIn) {
  write_bytes(path_, read_file(fixture("state_dict.pt")));
  EXPECT_EQ(error_message([&] { read_safetensors(path_); }),
            path_ + ": not a safetensors file: it looks like a torch.save zip archive (dkit picks a file's format by "
                    "its extension: name it .pt)");
  write_bytes(path_, read_file(fixture("legacy.pt")));
  EXPECT_EQ(error_message([&] { read_safetensors(path_); }),
            path_ + ": not a safetensors file: it looks like a pickle, as torch.save before PyTorch 1.6 wrote (dkit "
                    "picks a file's format by its extension: name it .pt)");
  const std::string pt = dir_.file("model.pt");
  write_bytes(pt, read_file(fixture("dtypes.safetensors")));
  EXPECT_EQ(error_message([&] { read_torch_file(pt); }),
            pt + ": not a torch.save file: it looks like a safetensors file (dkit picks a file's format by its "
                 "extension: name it .safetensors)");
  EXPECT_EQ(error_message([&] { read_state_dict(pt); }), error_message([&] { read_torch_file(pt); }));
  EXPECT_EQ(error_message([&] { load_mlp(pt); }), error_message([&] { read_torch_file(pt); }));
}

// Writing.

TEST_F(SafetensorsTest, RefusesWhatSafetensorsCannotHold) {
  const std::string path = dir_.file("out.safetensors");
  const auto write = [&](const std::string& name, const at::Tensor& tensor, const SafetensorsMetadata& metadata = {}) {
    StateDict tensors("state dict key");
    tensors.insert(name, tensor);
    return error_message([&] { write_safetensors(path, tensors, metadata); });
  };
  EXPECT_EQ(write("c", torch::zeros({2}, torch::kComplexFloat)),
            "cannot write " + path + ": tensor 'c' is complex64, which dkit does not write to safetensors (it writes "
                                     "I64, F64, F32, I32, BF16, F16, I16, I8, U8 and BOOL)");
  EXPECT_EQ(write("__metadata__", torch::zeros({2})),
            "cannot write " + path + ": no tensor can be named '__metadata__', the key safetensors keeps for the "
                                     "metadata");
  EXPECT_EQ(write("u", at::Tensor()), "cannot write " + path + ": tensor 'u' is undefined");
  EXPECT_EQ(write("bad\xff", torch::zeros({2})), "cannot write " + path + ": tensor name 'bad\xff' is not valid UTF-8");
  EXPECT_EQ(write("w", torch::zeros({2}), {{"k", "\xc3"}}),
            "cannot write " + path + ": metadata 'k' is not valid UTF-8");
  EXPECT_EQ(write("w", torch::zeros({2}), {{"k", std::string(100'000'000, 'x')}}),
            "cannot write " + path + ": its header would be 100000080 bytes, more than the 100000000 that "
                                     "safetensors readers accept");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path()), {}), 0) << "a temporary file was left";
}

TEST_F(SafetensorsTest, AFailedWriteLeavesThePreviousFileIntact) {
  const std::string path = dir_.file("model.safetensors");
  StateDict small("state dict key");
  small.insert("w", torch::zeros({4}));
  write_safetensors(path, small);
  const std::string before = read_file(path);
  StateDict big("state dict key");
  big.insert("w", torch::zeros({100000}));
  // A file size limit makes the write fail with EFBIG, as a full disk fails with ENOSPC.
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = old_limit;
  limited.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string message = error_message([&] { write_safetensors(path, big); });
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(message, "cannot write " + path + ": File too large (the existing file is unchanged)");
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path()), {}), 1) << "a temporary file was left";
  const std::string folder = dir_.file("no/such");
  EXPECT_EQ(error_message([&] { write_safetensors(folder + "/x.safetensors", small); }),
            "cannot write " + folder + "/x.safetensors: cannot create a temporary file in " + folder +
                ": No such file or directory");
}

// State dicts, models and the extension.

TEST_F(SafetensorsTest, KnowsASafetensorsPathByItsExtension) {
  EXPECT_TRUE(is_safetensors_path("model.safetensors"));
  EXPECT_TRUE(is_safetensors_path("dir.pt/Model.SafeTensors"));
  EXPECT_FALSE(is_safetensors_path("model.safetensors.pt"));
  EXPECT_FALSE(is_safetensors_path("model.pt"));
  EXPECT_FALSE(is_safetensors_path("safetensors"));
}

TEST_F(SafetensorsTest, ReadsAndWritesStateDictsByExtension) {
  const StateDict from_pt = read_state_dict(fixture("seed_model.pt"));
  expect_same(read_state_dict(fixture("seed_model.safetensors")), from_pt);
  for (const std::string name : {"sd.safetensors", "sd.pt"}) {
    write_state_dict(dir_.file(name), from_pt);
    expect_same(read_state_dict(dir_.file(name)), from_pt);
  }
  EXPECT_EQ(read_file(dir_.file("sd.safetensors")), read_file(fixture("seed_model.safetensors")));
  EXPECT_EQ(read_file(dir_.file("sd.pt")).substr(0, 4), "PK\x03\x04");

  StateDict wrapped("state dict key");
  wrapped.insert("module.0.weight", torch::ones({2, 2}));
  wrapped.insert("module.0.bias", torch::ones({2}));
  write_state_dict(dir_.file("wrapped.safetensors"), wrapped);
  EXPECT_EQ(read_state_dict(dir_.file("wrapped.safetensors")).keys(), (std::vector<std::string>{"0.bias", "0.weight"}));
  EXPECT_EQ(read_state_dict(dir_.file("wrapped.safetensors"), {}, StateDictOptions().renames({{"0.", "layer."}}))
                .keys(),
            (std::vector<std::string>{"layer.bias", "layer.weight"}));
}

TEST_F(SafetensorsTest, LoadsAnMlpWithItsInputNormalisation) {
  const auto rows = read_rows(fixture("mlp_input.csv"));
  const LoadedMlp model = load_mlp(fixture("normalized_mlp.safetensors"));
  ASSERT_TRUE(model.input_mean.defined());
  EXPECT_TRUE(torch::equal(model.input_std, torch::tensor({2.0f, 0.5f, 1.5f, 1.0f})));
  EXPECT_TRUE(torch::allclose(model.predict(rows), read_rows(fixture("normalized_mlp_logits.csv")), 1e-6, 1e-6));

  const LoadedMlp deep = load_mlp(fixture("deep_mlp.safetensors"));
  EXPECT_EQ(deep.net->options.hidden(), (std::vector<int64_t>{6, 5, 4, 5, 3}));
  EXPECT_TRUE(torch::allclose(deep.predict(rows), read_rows(fixture("deep_mlp_logits.csv")), 1e-6, 1e-6));
}

TEST_F(SafetensorsTest, ExportsAnMlpAsSafetensors) {
  const LoadedMlp model = load_mlp(fixture("normalized_mlp.safetensors"));
  const std::string path = dir_.file("export.safetensors");
  export_mlp(path, model);
  EXPECT_EQ(read_safetensors(path).tensors.keys(),
            (std::vector<std::string>{"0.bias", "0.weight", "2.bias", "2.weight", "input_mean", "input_std"}));
  const auto rows = read_rows(fixture("mlp_input.csv"));
  EXPECT_TRUE(torch::equal(load_mlp(path).predict(rows), model.predict(rows)));
  export_mlp(dir_.file("export.pt"), model);
  EXPECT_TRUE(torch::equal(load_mlp(dir_.file("export.pt")).predict(rows), model.predict(rows)));
}

// Python's safetensors on files dkit writes (Debian 13 and later; skipped on Debian 12, which has no
// python3-safetensors).
TEST_F(SafetensorsTest, PythonReadsWhatDkitWrites) {
  DKIT_SKIP_WITHOUT_PYTHON_SAFETENSORS();
  StateDict views("state dict key");
  const auto weight = torch::arange(12, torch::kFloat).reshape({3, 4});
  views.insert("weight", weight);
  views.insert("transposed", weight.t());
  views.insert("row", weight[1]);
  write_safetensors(dir_.file("dtypes.safetensors"), dtype_tensors(), {{"format", "pt"}});
  write_safetensors(dir_.file("views.safetensors"), views, {{"quoted \"key\"", "line\nbreak \xe2\x9c\x93"}});
  const auto result = test::run_python(dir_.file("check.py"), R"(import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file, save
base = torch.arange(-6, 6).reshape(3, 4)
expected = {
    "f64": base.to(torch.float64) / 4, "f32": base.to(torch.float32) / 4, "f16": base.to(torch.float16) / 4,
    "bf16": base.to(torch.bfloat16) / 4, "i64": base * 1_000_000_007, "i32": (base * 100_003).to(torch.int32),
    "i16": (base * 1_009).to(torch.int16), "i8": (base * 10).to(torch.int8),
    "u8": torch.arange(0, 240, 20).reshape(3, 4).to(torch.uint8), "bool": (torch.arange(12) % 3 == 0).reshape(3, 4),
    "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
}
d = load_file(sys.argv[1])
assert sorted(d) == sorted(expected), sorted(d)
for name, tensor in expected.items():
    assert d[name].dtype == tensor.dtype and d[name].shape == tensor.shape, (name, d[name].dtype, d[name].shape)
    assert torch.equal(d[name], tensor), name
with safe_open(sys.argv[1], framework="pt") as f:
    assert f.metadata() == {"format": "pt"}, f.metadata()
assert save(expected, metadata={"format": "pt"}) == open(sys.argv[1], "rb").read(), "not what Python writes"
v = load_file(sys.argv[2])
w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
assert torch.equal(v["weight"], w) and torch.equal(v["transposed"], w.t()) and torch.equal(v["row"], w[1])
with safe_open(sys.argv[2], framework="pt") as f:
    assert f.metadata() == {'quoted "key"': "line\nbreak \u2713"}, f.metadata()
print("ok")
)",
                                        dir_.file("dtypes.safetensors") + " " + dir_.file("views.safetensors"));
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, "ok\n");
}

} // namespace
} // namespace dkit
