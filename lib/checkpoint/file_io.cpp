#include <dkit/checkpoint/detail/file_io.h>

#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace dkit::detail {

bool ByteSource::read_exact(uint64_t offset, void* out, size_t n) const {
  if (offset > size_ || n > size_ - offset) {
    return false;
  }
  if (n == 0 || read_at(offset, out, n) == n) {
    return true;
  }
  check_no_io_error();
  return false;
}

size_t ByteSource::read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const {
  if (pos >= size_ || n == 0) {
    return 0;
  }
  return read_at(pos, buf, static_cast<size_t>(std::min<uint64_t>(n, size_ - pos)));
}

FileSource::FileSource(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DKIT_CHECK(fd_ >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || S_ISDIR(info.st_mode)) {
    const int error = errno;
    const bool folder = S_ISDIR(info.st_mode);
    ::close(fd_);
    DKIT_CHECK(!folder, path, ": is a directory, not a file");
    throw Error(detail::concat(path, ": cannot read: ", std::strerror(error)));
  }
  size_ = static_cast<uint64_t>(info.st_size);
}

FileSource::~FileSource() {
  ::close(fd_);
}

size_t FileSource::read_at(uint64_t offset, void* out, size_t n) const noexcept {
  auto* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, bytes + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      error_ = got < 0 ? errno : 0;
      break;
    }
    done += static_cast<size_t>(got);
  }
  return done;
}

void FileSource::check_no_io_error() const {
  DKIT_CHECK(error_ == 0, path_, ": cannot read: ", std::strerror(error_));
}

MemorySource::MemorySource(std::string_view data) : data_(data) {
  size_ = data.size();
}

size_t MemorySource::read_at(uint64_t offset, void* out, size_t n) const noexcept {
  std::memcpy(out, data_.data() + offset, n);
  return n;
}

void check_map_location(const std::string& path, const c10::Device& device) {
  DKIT_CHECK(is_available(device), path, ": cannot load to ", device, ": it is not available here (available: ",
             available_devices(), ")");
}

FileKind sniff(const ByteSource& file) {
  unsigned char head[9] = {};
  const size_t n = std::min<size_t>(file.size(), sizeof(head));
  if (!file.read_exact(0, head, n)) {
    return FileKind::kUnknown;
  }
  if (n >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) {
    return FileKind::kZip;
  }
  if (n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5) {
    return FileKind::kPickle;
  }
  uint64_t header = 0;
  for (size_t i = 0; i < 8 && i < n; ++i) {
    header |= static_cast<uint64_t>(head[i]) << (8 * i);
  }
  if (n == 9 && head[8] == '{' && header <= file.size() - 8) {
    return FileKind::kSafetensors;
  }
  return FileKind::kUnknown;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  const auto parent = std::filesystem::path(path).parent_path();
  folder_ = parent.empty() ? "." : parent.string();
  temp_ = path + ".tmp.XXXXXX";
  fd_ = ::mkstemp(temp_.data());
  DKIT_CHECK(fd_ >= 0, "cannot write ", path, ": cannot create a temporary file in ", folder_, ": ",
             std::strerror(errno));
  ::fchmod(fd_, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
  if (!committed_) {
    ::unlink(temp_.c_str());
  }
}

size_t AtomicFile::write(const void* data, size_t n) {
  if (error_ == 0) {
    if (buffer_.size() + n > kBufferBytes) {
      flush();
    }
    if (n >= kBufferBytes) {
      write_all(static_cast<const char*>(data), n);
    } else {
      buffer_.append(static_cast<const char*>(data), n);
    }
  }
  return n;
}

void AtomicFile::commit() {
  flush();
  if (error_ == 0 && ::fsync(fd_) != 0) {
    error_ = errno;
  }
  if (::close(fd_) != 0 && error_ == 0) {
    error_ = errno;
  }
  fd_ = -1;
  const bool existed = std::filesystem::exists(path_);
  DKIT_CHECK(error_ == 0, "cannot write ", path_, ": ", std::strerror(error_),
             existed ? " (the existing file is unchanged)" : "");
  DKIT_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, "cannot write ", path_, ": rename failed: ",
             std::strerror(errno), existed ? " (the existing file is unchanged)" : "");
  committed_ = true;
  const int folder = ::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DKIT_CHECK(folder >= 0 && ::fsync(folder) == 0, "wrote ", path_, " but could not sync its folder ", folder_,
             ": ", std::strerror(errno));
  ::close(folder);
}

void AtomicFile::flush() {
  if (error_ == 0 && !buffer_.empty()) {
    write_all(buffer_.data(), buffer_.size());
  }
  buffer_.clear();
}

void AtomicFile::write_all(const char* data, size_t n) {
  while (n > 0 && error_ == 0) {
    const ssize_t done = ::write(fd_, data, n);
    if (done < 0 && errno == EINTR) {
      continue;
    }
    if (done <= 0) {
      error_ = done < 0 ? errno : EIO;
      return;
    }
    data += done;
    n -= static_cast<size_t>(done);
  }
}

} // namespace dkit::detail
