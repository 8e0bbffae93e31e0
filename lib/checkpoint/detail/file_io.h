#pragma once

// Internal to the checkpoint module's file readers and writers (torch_file.cpp, safetensors.cpp); not one of the
// installed headers.

#include <c10/core/Device.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dkit::detail {

/// The bytes of a file being read: an open file or a buffer. LibTorch's zip reader reads through the same object,
/// so that it sees exactly the bytes dkit checked (a file replaced after the checks is not read), and never more.
class ByteSource : public caffe2::serialize::ReadAdapterInterface {
 public:
  /// Reads exactly `n` bytes at `offset`, or returns false when the source is shorter; an I/O error is an error.
  bool read_exact(uint64_t offset, void* out, size_t n) const;

  /// The number of bytes.
  size_t size() const override {
    return static_cast<size_t>(size_);
  }

  /// What LibTorch's reader calls; it never throws, since it is called from inside miniz's C code.
  size_t read(uint64_t pos, void* buf, size_t n, const char* what) const override;

 protected:
  /// Reads up to `n` bytes at `offset`, which lie within the source; fewer on an I/O error. Never throws.
  virtual size_t read_at(uint64_t offset, void* out, size_t n) const noexcept = 0;

  /// Throws the I/O error behind a short read_at(), if there was one.
  virtual void check_no_io_error() const {}

  /// The number of bytes, set by the constructor of each kind of source.
  uint64_t size_ = 0;
};

/// An open file; an error names it when it cannot be opened or is a folder.
class FileSource : public ByteSource {
 public:
  /// Opens `path` for reading.
  explicit FileSource(const std::string& path);
  ~FileSource() override;
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

 protected:
  size_t read_at(uint64_t offset, void* out, size_t n) const noexcept override;
  void check_no_io_error() const override;

 private:
  std::string path_;
  int fd_ = -1;
  mutable int error_ = 0;
};

/// Bytes already in memory, which must outlive the source.
class MemorySource : public ByteSource {
 public:
  /// Reads `data`.
  explicit MemorySource(std::string_view data);

 protected:
  size_t read_at(uint64_t offset, void* out, size_t n) const noexcept override;

 private:
  std::string_view data_;
};

/// What the start of a file shows it to be, for errors about a file whose content its extension does not match.
enum class FileKind { kUnknown, kZip, kPickle, kSafetensors };

/// What `file` looks like from its first bytes: a zip archive (`torch.save`), a pickle (`torch.save`'s legacy
/// format or a plain pickle), a safetensors file (a header length that fits the file, then `{`), or unknown.
FileKind sniff(const ByteSource& file);

/// Refuses a map_location that is not available here, naming `path` (the file or buffer being read) and the devices
/// that are.
void check_map_location(const std::string& path, const c10::Device& device);

/// A file written atomically: the bytes go to a temporary file in the same folder, and commit() syncs it, renames
/// it over the path and syncs the folder. Destroyed without commit(), it removes the temporary file and leaves a
/// previous file at the path as it was.
class AtomicFile {
 public:
  /// Creates the temporary file beside `path`; an error names `path` and the folder.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `n` bytes. Never reports a failure (PyTorchStreamWriter's destructor would otherwise throw): the
  /// first error is kept and reported by commit(). Returns `n`.
  size_t write(const void* data, size_t n);

  /// Flushes, syncs and renames the file over the path; an error names the path and says the previous file is
  /// unchanged when there was one.
  void commit();

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;

  void flush();
  void write_all(const char* data, size_t n);

  std::string path_;
  std::string folder_;
  std::string temp_;
  std::string buffer_;
  int fd_ = -1;
  int error_ = 0;
  bool committed_ = false;
};

} // namespace dkit::detail
