#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ftw.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dkit::test {

/// Removes `path` and everything under it, quietly (what is gone or cannot be removed is left as it is). Not
/// std::filesystem::remove_all: a PyTorch wheel's libtorch_cpu.so exports the libstdc++ filesystem code it was
/// linked with statically (pytorch/pytorch#133437), and a test binary linked to it crashed in remove_all on a
/// directory with files in it (the lent H200 machine, PyTorch 2.11, 2026-11-26).
inline void remove_tree(const std::string& path) {
  nftw(
      path.c_str(), [](const char* name, const struct stat*, int, struct FTW*) { return std::remove(name), 0; }, 16,
      FTW_DEPTH | FTW_PHYS);
}

/// Seeds LibTorch's generators before every test, as LibTorch's own test/cpp/api/support.h does.
class SeedingFixture : public ::testing::Test {
 protected:
  SeedingFixture() {
    torch::manual_seed(0);
  }
};

/// A fresh directory under the system's temporary directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The directory.
  const std::filesystem::path& path() const {
    return path_;
  }

  /// `path() / name` as a string.
  std::string file(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

inline TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "dkit-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed for " + pattern);
  }
  path_ = pattern;
}

inline TempDir::~TempDir() {
  remove_tree(path_.string());
}

/// The whole contents of the file at `path`; empty when it cannot be read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Writes `data` to the file at `path`, replacing what was there.
inline void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

/// Writes the CPU tensor `tensor` (float32, float64, uint8, int32 or int64) as NumPy's `np.save` writes it:
/// format 1.0, C order, the header padded with spaces to a multiple of 64 bytes. `dtype_code` names the bytes'
/// dtype instead when given: `<u2` for an int16 tensor of unsigned 16-bit numbers.
inline void write_npy(const std::string& path, const torch::Tensor& tensor, const char* dtype_code = nullptr) {
  const torch::Tensor data = tensor.contiguous();
  const char* descr = dtype_code != nullptr                  ? dtype_code
                      : data.scalar_type() == torch::kFloat  ? "<f4"
                      : data.scalar_type() == torch::kDouble ? "<f8"
                      : data.scalar_type() == torch::kByte   ? "|u1"
                      : data.scalar_type() == torch::kInt    ? "<i4"
                                                             : "<i8";
  std::string shape;
  for (const int64_t size : data.sizes()) {
    shape += std::to_string(size) + ", ";
  }
  if (data.dim() > 1) {
    shape.resize(shape.size() - 2);
  } else if (data.dim() == 1) {
    shape.resize(shape.size() - 1);
  }
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string file = "\x93NUMPY";
  file += '\x01';
  file += '\x00';
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  file += header;
  file.append(static_cast<const char*>(data.data_ptr()), data.numel() * data.element_size());
  write_bytes(path, file);
}

/// The elements of `tensor` (on any device, of any real dtype) converted to int64, in order.
inline std::vector<int64_t> int64s(const torch::Tensor& tensor) {
  const torch::Tensor flat = tensor.to(torch::kLong).cpu().contiguous();
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

/// Rows of comma-separated numbers, as tests/fixtures/make_fixtures.py writes inputs and expected logits, as a
/// float32 tensor `[rows, columns]`.
inline torch::Tensor read_rows(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream cells(line);
    std::string cell;
    rows.emplace_back();
    while (std::getline(cells, cell, ',')) {
      rows.back().push_back(std::stod(cell));
    }
  }
  auto out = torch::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.at(0).size())});
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < rows[r].size(); ++c) {
      out[static_cast<int64_t>(r)][static_cast<int64_t>(c)] = rows[r][c];
    }
  }
  return out;
}

/// A committed fixture file made by real PyTorch (see tests/fixtures/make_fixtures.py and
/// make_safetensors_fixtures.py).
inline std::string fixture(const std::string& name) {
  return std::string(DKIT_FIXTURES_DIR) + "/" + name;
}

/// The message of the dkit::Error (or c10::Error, without its backtrace, or any std::exception) that `fn` throws; fails the test when it throws none.
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

} // namespace dkit::test
