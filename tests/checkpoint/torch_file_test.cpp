#include <dkit/checkpoint/torch_file.h>

#include <dkit/device/device.h>

#include "../support.h"
#include "python.h"

#include <caffe2/serialize/inline_container.h>

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <random>

namespace dkit {
namespace {

using test::error_message;
using test::fixture;
using test::read_file;
using test::write_bytes;

// Sets a 32-bit field of the central directory entry of `record` in a zip held in memory.
void patch_central_entry(std::string& zip, const std::string& record, size_t field, uint32_t value) {
  const size_t name = zip.rfind(record);
  ASSERT_NE(name, std::string::npos);
  const size_t header = name - 46;
  ASSERT_EQ(zip.compare(header, 4, "PK\x01\x02"), 0);
  for (int i = 0; i < 4; ++i) {
    zip[header + field + static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

// A zip archive as torch.save lays it out, with a pickle and storage records chosen by the test.
void write_archive(const std::string& path, const std::string& pickle_bytes,
                   const std::vector<std::pair<std::string, std::string>>& records) {
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("data.pkl", pickle_bytes.data(), pickle_bytes.size());
  for (const auto& [name, data] : records) {
    writer.writeRecord(name, data.data(), data.size());
  }
  writer.writeEndOfFile();
}

// `{'w': tensor}` over storage '0' of `numel` float32 values, sizes [numel], offset `offset`.
std::string one_tensor_pickle(int numel, int offset) {
  PickleValue value = PickleValue::dict({{"w", torch::zeros({numel})}});
  std::string data = pickle(value).data;
  if (offset != 0) {
    const std::string from = std::string("K") + static_cast<char>(numel) + "tQK" + static_cast<char>(0);
    const size_t at = data.find(from);
    EXPECT_NE(at, std::string::npos);
    data[at + from.size() - 1] = static_cast<char>(offset);
  }
  return data;
}

class TorchFileTest : public test::SeedingFixture {
 protected:
  test::TempDir dir_;
};

TEST_F(TorchFileTest, ReadsAPlainStateDict) {
  const TorchFile file = read_torch_file(fixture("state_dict.pt"));
  EXPECT_EQ(file.archive, "state_dict");
  EXPECT_EQ(file.version, 3);
  ASSERT_TRUE(file.root.is_ordered_dict());
  std::vector<std::string> names;
  for (const auto& [key, value] : file.root.entries()) {
    names.push_back(key.to_string());
    EXPECT_EQ(value.saved_on(), "cpu");
    EXPECT_EQ(value.to_tensor().scalar_type(), torch::kFloat);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(file.root.find("0.weight")->to_tensor().sizes().vec(), (std::vector<int64_t>{3, 4}));
}

TEST_F(TorchFileTest, ReadsAGeneralCheckpointWithOptimizerState) {
  const PickleValue root = read_torch_file(fixture("general_checkpoint.pt")).root;
  EXPECT_EQ(root.find("epoch")->to_int(), 5);
  EXPECT_EQ(root.find("loss")->to_double(), 0.25);
  const PickleValue& optimizer = *root.find("optimizer_state_dict");
  const PickleValue& group = optimizer.find("param_groups")->items().at(0);
  EXPECT_EQ(group.find("lr")->to_double(), 0.01);
  EXPECT_EQ(group.find("betas")->items()[1].to_double(), 0.999);
  EXPECT_TRUE(group.find("foreach")->is_none());
  EXPECT_EQ(group.find("params")->items().size(), 4u);
  const PickleValue& state = *optimizer.find("state")->find(int64_t{2});
  EXPECT_EQ(state.find("step")->to_tensor().item<float>(), 2.0f);
  EXPECT_EQ(state.find("exp_avg")->to_tensor().sizes().vec(), (std::vector<int64_t>{2, 3}));
}

TEST_F(TorchFileTest, KeepsTheDeviceStoragesWereSavedOn) {
  const TorchFile file = read_torch_file(fixture("cuda_tagged.pt"));
  const PickleValue& weight = *file.root.find("0.weight");
  EXPECT_EQ(weight.saved_on(), "cuda:0");
  EXPECT_EQ(weight.to_tensor().device(), cpu());
  EXPECT_TRUE(torch::equal(weight.to_tensor(), read_torch_file(fixture("state_dict.pt")).root.find("0.weight")->to_tensor()));
}

TEST_F(TorchFileTest, ReadsHalfBfloat16AndDouble) {
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, c10::ScalarType>>{
           {"dtype_float16.pt", torch::kHalf}, {"dtype_bfloat16.pt", torch::kBFloat16}, {"dtype_float64.pt", torch::kDouble}}) {
    const PickleValue root = read_torch_file(fixture(name)).root;
    EXPECT_EQ(root.find("2.weight")->to_tensor().scalar_type(), dtype) << name;
  }
}

TEST_F(TorchFileTest, RefusesAnUnavailableMapLocation) {
  if (num_gpus() > 0) {
    GTEST_SKIP() << "a GPU is visible: cuda:0 is available";
  }
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path, ReadOptions().map_location(gpu(0))); }),
            path + ": cannot load to cuda:0: it is not available here (available: cpu)");
}

TEST_F(TorchFileTest, LoadsAGpuSavedFileToTheGpu_CUDA) {
  const TorchFile file = read_torch_file(fixture("cuda_tagged.pt"), ReadOptions().map_location(gpu(0)));
  const at::Tensor& weight = file.root.find("0.weight")->to_tensor();
  EXPECT_EQ(weight.device(), gpu(0));
  EXPECT_TRUE(torch::equal(weight.cpu(), read_torch_file(fixture("cuda_tagged.pt")).root.find("0.weight")->to_tensor()));
}

TEST_F(TorchFileTest, SavesFromTheGpuForTheCpu_CUDA) {
  const auto weight = torch::randn({5, 3}, torch::Device(torch::kCUDA, 0));
  write_torch_file(dir_.file("gpu.pt"), PickleValue::dict({{"w", weight}}));
  const PickleValue& back = *read_torch_file(dir_.file("gpu.pt")).root.find("w");
  EXPECT_EQ(back.saved_on(), "cpu");
  EXPECT_EQ(back.to_tensor().device(), cpu());
  EXPECT_TRUE(torch::equal(back.to_tensor(), weight.cpu()));
}

TEST_F(TorchFileTest, ExplainsAnEmptyFile) {
  const std::string path = dir_.file("empty.pt");
  write_bytes(path, "");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }), path + ": the file is empty");
}

TEST_F(TorchFileTest, ExplainsATruncatedFile) {
  const std::string path = dir_.file("truncated.pt");
  const std::string whole = read_file(fixture("state_dict.pt"));
  write_bytes(path, whole.substr(0, whole.size() / 2));
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": truncated or corrupt zip archive: no end of central directory record (the file may have been "
                   "cut short)");
}

TEST_F(TorchFileTest, ExplainsRandomBytes) {
  const std::string path = dir_.file("random.pt");
  std::mt19937 generator(7);
  std::string data(4096, '\0');
  for (auto& c : data) {
    c = static_cast<char>(generator() & 0xff);
  }
  data[0] = '\x13';
  data[1] = '\x37';
  data[2] = '\x00';
  data[3] = '\xfe';
  write_bytes(path, data);
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": not a PyTorch file: it starts with bytes 13 37 00 fe, neither a torch.save zip archive nor "
                   "PyTorch's legacy format");
}

TEST_F(TorchFileTest, ExplainsTheLegacyFormatAndHowToResave) {
  const std::string path = fixture("legacy.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": this file uses PyTorch's legacy serialization format (torch.save before PyTorch 1.6, or with "
                   "_use_new_zipfile_serialization=False), which dkit does not read; re-save it with a recent "
                   "PyTorch: torch.save(torch.load('" + path + "'), 'new.pt')");
}

TEST_F(TorchFileTest, ExplainsATorchScriptArchive) {
  const std::string path = fixture("torchscript.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": this is a TorchScript archive (torch.jit.save), not a torch.save file; save its weights in "
                   "Python with torch.save(torch.jit.load('" + path + "').state_dict(), 'weights.pt')");
}

TEST_F(TorchFileTest, ExplainsACorruptPickle) {
  const std::string path = fixture("corrupt_pickle.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": corrupt pickle: the data ends inside BINPUT at byte 236");
}

TEST_F(TorchFileTest, RefusesAnOsSystemGlobalWithoutRunningIt) {
  const std::string marker = "/tmp/dkit_fixture_os_system_ran";
  std::filesystem::remove(marker);
  const std::string path = fixture("os_system.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": refusing the pickle global 'posix.system': only tensors, containers, numbers and strings can be "
                   "loaded (as with torch.load(weights_only=True)); nothing was executed");
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the fixture's command ran";
}

TEST_F(TorchFileTest, ExplainsAPlainPickle) {
  const std::string path = dir_.file("plain.pkl");
  write_bytes(path, std::string("\x80\x02K\x01.", 5));
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": this is a plain pickle, not a torch.save archive; load it in Python and save it with torch.save");
}

TEST_F(TorchFileTest, ExplainsAMissingFileOrAFolder) {
  const std::string path = dir_.file("missing.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }), path + ": cannot open: No such file or directory");
  EXPECT_EQ(error_message([&] { read_torch_file(dir_.path().string()); }),
            dir_.path().string() + ": is a directory, not a file");
}

TEST_F(TorchFileTest, RejectsAHugeClaimedRecordSizeBeforeAllocating) {
  std::string zip = read_file(fixture("state_dict.pt"));
  const std::string path = dir_.file("huge.pt");
  patch_central_entry(zip, "state_dict/data/0", /*field=*/24, 0x7fffffff);
  write_bytes(path, zip);
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": truncated or corrupt zip archive: record 'state_dict/data/0' claims 2147483647 bytes but stores 48");
  patch_central_entry(zip, "state_dict/data/0", /*field=*/20, 0x7fffffff);
  write_bytes(path, zip);
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": truncated or corrupt zip archive: record 'state_dict/data/0' reaches past the end of the file "
                   "(the file may have been cut short)");
}

TEST_F(TorchFileTest, LimitsFileSize) {
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path, ReadOptions().limits(ReadLimits().max_file_bytes(1000))); }),
            path + ": the file is 1649 bytes, more than the limit of 1000 (max_file_bytes)");
}

TEST_F(TorchFileTest, LimitsRecordSize) {
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path, ReadOptions().limits(ReadLimits().max_record_bytes(40))); }),
            path + ": record 'state_dict/data.pkl' is 473 bytes, more than the limit of 40 (max_record_bytes)");
}

TEST_F(TorchFileTest, LimitsRecordCount) {
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path, ReadOptions().limits(ReadLimits().max_records(3))); }),
            path + ": the archive holds 6 records, more than the limit of 3 (max_records)");
}

TEST_F(TorchFileTest, LimitsPickleSize) {
  const std::string path = fixture("state_dict.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path, ReadOptions().limits(ReadLimits().max_pickle_bytes(100))); }),
            path + ": data.pkl is 473 bytes, more than the limit of 100 (max_pickle_bytes)");
}

TEST_F(TorchFileTest, RejectsAStorageRecordOfTheWrongSize) {
  const std::string path = dir_.file("short.pt");
  write_archive(path, one_tensor_pickle(6, 0), {{"data/0", std::string(20, '\0')}});
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": record data/0 holds 20 bytes but the pickle says its storage is 6 float32 values");
}

TEST_F(TorchFileTest, RejectsAMissingStorageRecord) {
  const std::string path = dir_.file("missing_storage.pt");
  write_archive(path, one_tensor_pickle(6, 0), {});
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": the pickle refers to storage '0' but the archive has no data/0 record");
}

TEST_F(TorchFileTest, RejectsATensorOutsideItsStorageInAFile) {
  const std::string path = dir_.file("outside.pt");
  write_archive(path, one_tensor_pickle(6, 3), {{"data/0", std::string(24, '\0')}});
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": a tensor with offset 3, sizes [6] and strides [1] over storage '0' of 6 elements: it reaches "
                   "past the end of its storage");
}

TEST_F(TorchFileTest, ReadsAnArchiveInMemory) {
  const TorchFile from_file = read_torch_file(fixture("general_checkpoint.pt"));
  const TorchFile in_memory = read_torch_bytes(read_file(fixture("general_checkpoint.pt")), "in memory");
  EXPECT_EQ(in_memory.archive, from_file.archive);
  EXPECT_EQ(in_memory.version, from_file.version);
  std::vector<std::pair<std::string, at::Tensor>> expected;
  for_each_tensor(from_file.root, [&](const std::string& name, const PickleValue& tensor) {
    expected.emplace_back(name, tensor.to_tensor());
  });
  size_t i = 0;
  for_each_tensor(in_memory.root, [&](const std::string& name, const PickleValue& tensor) {
    ASSERT_LT(i, expected.size());
    EXPECT_EQ(name, expected[i].first);
    EXPECT_TRUE(torch::equal(tensor.to_tensor(), expected[i].second)) << name;
    ++i;
  });
  EXPECT_EQ(i, expected.size());
  EXPECT_EQ(error_message([] { read_torch_bytes(std::string("PK\x03\x04", 4), "in memory"); }),
            "in memory: truncated or corrupt zip archive: no end of central directory record (the file may have "
            "been cut short)");
}

// Inputs the fuzzer found (scripts/fuzz.sh), kept in tests/fixtures/fuzz/. Each was a clean error already in a
// normal build; the sanitizers saw what went wrong on the way, which the sanitized suite (scripts/sanitize.sh)
// checks again here.

// A central directory entry with an empty name: dkit's reader called memcpy with a null pointer (UBSan).
TEST_F(TorchFileTest, FuzzFindingAnEntryWithAnEmptyName) {
  const std::string path = fixture("fuzz/torch_file-empty-name-ub.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": truncated or corrupt zip archive: record '' claims 397568 bytes but stores 6");
}

// A version record LibTorch cannot parse: PyTorchStreamReader's constructor threw after opening its zip reader,
// which leaked (LeakSanitizer). dkit now checks the version itself before the constructor runs.
TEST_F(TorchFileTest, FuzzFindingAnUnparsableVersionRecord) {
  const std::string path = fixture("fuzz/torch_file-version-leak.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": the archive's version record holds 'Z3', not a format version");
}

// The version record marked as a folder (DOS attribute 0x10): miniz returns a folder's bytes without writing
// them, so PyTorchStreamReader parsed uninitialized memory as the version, threw, and leaked. The same would have
// handed a storage record's uninitialized bytes to a tensor.
TEST_F(TorchFileTest, FuzzFindingARecordMarkedAsAFolder) {
  const std::string path = fixture("fuzz/torch_file-folder-entry.pt");
  EXPECT_EQ(error_message([&] { read_torch_file(path); }),
            path + ": truncated or corrupt zip archive: record 'nested_state_dict/version' is a folder entry, which "
                   "torch.save never writes");
}

TEST_F(TorchFileTest, ReadsWhatItWrites) {
  const auto weight = torch::randn({4, 3});
  const auto half = torch::randn({2, 2}).to(torch::kHalf);
  const auto counts = torch::arange(5, torch::kLong);
  PickleValue root = PickleValue::dict({{"weight", weight},
                                        {"transposed", weight.t()},
                                        {"row", weight[2]},
                                        {"half", half},
                                        {"counts", counts},
                                        {"flags", torch::tensor({true, false})},
                                        {"meta", PickleValue::dict({{"epoch", 3}, {"lr", 0.5}, {"name", "run"}})}});
  const std::string path = dir_.file("out.pt");
  write_torch_file(path, root);
  const TorchFile file = read_torch_file(path);
  EXPECT_EQ(file.archive, "archive");
  const auto& back = file.root;
  EXPECT_TRUE(torch::equal(back.find("weight")->to_tensor(), weight));
  EXPECT_TRUE(torch::equal(back.find("transposed")->to_tensor(), weight.t()));
  EXPECT_TRUE(torch::equal(back.find("row")->to_tensor(), weight[2]));
  EXPECT_EQ(back.find("row")->to_tensor().storage().data(), back.find("weight")->to_tensor().storage().data());
  EXPECT_TRUE(torch::equal(back.find("half")->to_tensor(), half));
  EXPECT_TRUE(torch::equal(back.find("counts")->to_tensor(), counts));
  EXPECT_EQ(back.find("flags")->to_tensor().scalar_type(), torch::kBool);
  EXPECT_EQ(back.find("meta")->find("lr")->to_double(), 0.5);
  EXPECT_EQ(back.find("meta")->find("name")->to_string(), "run");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path()), {}), 1) << "a temporary file was left";
}

TEST_F(TorchFileTest, PythonReadsWhatItWrites) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  const auto weight = torch::arange(12, torch::kFloat).reshape({3, 4});
  PickleValue tensors = PickleValue::ordered_dict({{"0.weight", weight},
                                                   {"0.bias", torch::ones({3}, torch::kDouble)},
                                                   {"t", weight.t()},
                                                   {"half", torch::full({2}, 0.5, torch::kHalf)},
                                                   {"bf16", torch::full({2}, 0.25, torch::kBFloat16)},
                                                   {"step", 12345678901}});
  write_torch_file(dir_.file("tensors.pt"), tensors);
  write_torch_file(dir_.file("floats.pt"),
                   PickleValue::dict({{"lr", 0.001}, {"betas", PickleValue::tuple({0.9, 0.999})}, {"w", weight}}));
  const auto result = test::run_python(dir_.file("check.py"), R"(import sys, torch
a = torch.load(sys.argv[1])
b = torch.load(sys.argv[1], weights_only=True)
w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
for d in (a, b):
    assert list(d.keys()) == ["0.weight", "0.bias", "t", "half", "bf16", "step"], list(d.keys())
    assert torch.equal(d["0.weight"], w)
    assert d["0.bias"].dtype == torch.float64 and torch.equal(d["0.bias"], torch.ones(3, dtype=torch.float64))
    assert torch.equal(d["t"], w.t()) and d["t"].stride() == (1, 4)
    assert d["t"].data_ptr() == d["0.weight"].data_ptr()
    assert d["half"].dtype == torch.float16 and d["half"].tolist() == [0.5, 0.5]
    assert d["bf16"].dtype == torch.bfloat16 and d["bf16"].tolist() == [0.25, 0.25]
    assert d["step"] == 12345678901
f = torch.load(sys.argv[2])
assert f["lr"] == 0.001 and f["betas"] == (0.9, 0.999) and torch.equal(f["w"], w)
if int(torch.__version__.split(".")[0]) >= 2:  # PyTorch 1.13's weights_only unpickler lacks BINFLOAT
    f = torch.load(sys.argv[2], weights_only=True)
    assert f["lr"] == 0.001
print("ok")
)",
                                        dir_.file("tensors.pt") + " " + dir_.file("floats.pt"));
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, "ok\n");
}

TEST_F(TorchFileTest, AFailedWriteLeavesThePreviousFileIntact) {
  const std::string path = dir_.file("last.pt");
  write_torch_file(path, PickleValue::dict({{"w", torch::zeros({4})}}));
  const std::string before = read_file(path);
  // A file size limit makes the write fail with EFBIG, as a full disk fails with ENOSPC.
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string message =
      error_message([&] { write_torch_file(path, PickleValue::dict({{"w", torch::zeros({100000})}})); });
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(message, "cannot write " + path + ": File too large (the existing file is unchanged)");
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path()), {}), 1) << "a temporary file was left";
}

TEST_F(TorchFileTest, ExplainsAWriteToAMissingFolder) {
  const std::string folder = dir_.file("no/such");
  EXPECT_EQ(error_message([&] { write_torch_file(folder + "/x.pt", PickleValue::dict()); }),
            "cannot write " + folder + "/x.pt: cannot create a temporary file in " + folder +
                ": No such file or directory");
}

} // namespace
} // namespace dkit
