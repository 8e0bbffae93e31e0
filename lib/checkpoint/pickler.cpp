#include <dkit/checkpoint/pickler.h>

#include <dkit/checkpoint/detail/pickle_storage_types.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

#include <cstring>
#include <map>

namespace dkit {
namespace {

const char* storage_type_name(c10::ScalarType dtype) {
  for (const auto& type : detail::kStorageTypes) {
    if (type.dtype == dtype) {
      return type.name;
    }
  }
  throw Error(detail::concat("cannot save a tensor of dtype ", dtype_name(dtype)));
}

class Pickler {
 public:
  Pickled run(const PickleValue& value) {
    out_ += "\x80\x02";
    write(value);
    out_ += '.';
    return {std::move(out_), std::move(storages_)};
  }

 private:
  void write_uint(uint64_t value, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      out_ += static_cast<char>((value >> (8 * i)) & 0xff);
    }
  }

  void write_int(int64_t value) {
    if (value >= 0 && value < 256) {
      out_ += 'K';
      write_uint(static_cast<uint64_t>(value), 1);
    } else if (value >= 0 && value < 65536) {
      out_ += 'M';
      write_uint(static_cast<uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      out_ += 'J';
      write_uint(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
    } else {
      size_t n = 8;
      while (n > 1) {
        const int64_t shifted = value >> (8 * (n - 1) - 1);
        if (shifted != 0 && shifted != -1) {
          break;
        }
        --n;
      }
      out_ += '\x8a';
      out_ += static_cast<char>(n);
      write_uint(static_cast<uint64_t>(value), n);
    }
  }

  void write_string(std::string_view text) {
    DKIT_CHECK(text.size() <= UINT32_MAX, "cannot pickle a string of ", text.size(), " bytes");
    out_ += 'X';
    write_uint(text.size(), 4);
    out_ += text;
  }

  void write_global(const char* module, const char* name) {
    out_ += 'c';
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }

  void write_ints(c10::IntArrayRef values) {
    if (values.empty()) {
      out_ += ')';
      return;
    }
    if (values.size() > 3) {
      out_ += '(';
    }
    for (const int64_t v : values) {
      write_int(v);
    }
    out_ += values.size() > 3 ? 't' : static_cast<char>(0x84 + values.size());
  }

  void write_tensor(const at::Tensor& tensor) {
    DKIT_CHECK(tensor.defined(), "cannot save an undefined tensor");
    DKIT_CHECK(tensor.layout() == c10::kStrided && !tensor.is_quantized(),
               "cannot save a tensor with layout ", tensor.layout(), " (only dense tensors)");
    const c10::ScalarType dtype = tensor.scalar_type();
    const auto element = static_cast<int64_t>(c10::elementSize(dtype));
    const c10::Storage& storage = tensor.storage();
    const auto id = std::make_pair(storage.unsafeGetStorageImpl(), dtype);
    auto found = keys_.find(id);
    if (found == keys_.end()) {
      const int64_t numel = static_cast<int64_t>(storage.nbytes()) / element;
      auto whole = at::empty({0}, tensor.options().dtype(dtype));
      whole.set_(storage, 0, {numel}, {1});
      found = keys_.emplace(id, storages_.size()).first;
      storages_.push_back(std::move(whole));
    }
    const auto& whole = storages_[found->second];
    write_global("torch._utils", "_rebuild_tensor_v2");
    out_ += "((";
    write_string("storage");
    write_global("torch", storage_type_name(dtype));
    write_string(std::to_string(found->second));
    write_string("cpu");
    write_int(whole.numel());
    out_ += "tQ";
    write_int(tensor.storage_offset());
    write_ints(tensor.sizes());
    write_ints(tensor.strides());
    out_ += '\x89';
    write_global("collections", "OrderedDict");
    out_ += ")R";
    out_ += "tR";
  }

  void write(const PickleValue& value) {
    switch (value.type()) {
      case PickleValue::Type::kNone: out_ += 'N'; break;
      case PickleValue::Type::kBool: out_ += value.to_bool() ? '\x88' : '\x89'; break;
      case PickleValue::Type::kInt: write_int(value.to_int()); break;
      case PickleValue::Type::kDouble: {
        const double number = value.to_double();
        uint64_t bits = 0;
        std::memcpy(&bits, &number, sizeof(bits));
        out_ += 'G';
        for (int i = 7; i >= 0; --i) {
          out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
        }
        break;
      }
      case PickleValue::Type::kString: write_string(value.to_string()); break;
      case PickleValue::Type::kTensor: write_tensor(value.to_tensor()); break;
      case PickleValue::Type::kList:
        out_ += ']';
        if (!value.items().empty()) {
          out_ += '(';
          for (const auto& item : value.items()) {
            write(item);
          }
          out_ += 'e';
        }
        break;
      case PickleValue::Type::kTuple: {
        const auto& items = value.items();
        if (items.empty()) {
          out_ += ')';
          break;
        }
        if (items.size() > 3) {
          out_ += '(';
        }
        for (const auto& item : items) {
          write(item);
        }
        out_ += items.size() > 3 ? 't' : static_cast<char>(0x84 + items.size());
        break;
      }
      case PickleValue::Type::kDict:
        if (value.is_ordered_dict()) {
          write_global("collections", "OrderedDict");
          out_ += ")R";
        } else {
          out_ += '}';
        }
        if (!value.entries().empty()) {
          out_ += '(';
          for (const auto& [key, item] : value.entries()) {
            write(key);
            write(item);
          }
          out_ += 'u';
        }
        break;
    }
  }

  std::string out_;
  std::vector<at::Tensor> storages_;
  std::map<std::pair<const c10::StorageImpl*, c10::ScalarType>, size_t> keys_;
};

} // namespace

Pickled pickle(const PickleValue& value) {
  return Pickler().run(value);
}

} // namespace dkit
