#include <dkit/checkpoint/pickle_value.h>

#include <dkit/core/error.h>

#include <torch/torch.h>

namespace dkit {

PickleValue::PickleValue(bool flag) : type_(Type::kBool), bool_(flag) {}
PickleValue::PickleValue(int64_t number) : type_(Type::kInt), int_(number) {}
PickleValue::PickleValue(int number) : type_(Type::kInt), int_(number) {}
PickleValue::PickleValue(double number) : type_(Type::kDouble), double_(number) {}
PickleValue::PickleValue(std::string text) : type_(Type::kString), string_(std::move(text)) {}
PickleValue::PickleValue(const char* text) : type_(Type::kString), string_(text) {}
PickleValue::PickleValue(at::Tensor tensor, std::string saved_on)
    : type_(Type::kTensor), string_(std::move(saved_on)), tensor_(std::move(tensor)) {}

PickleValue PickleValue::list(Items items) {
  PickleValue value;
  value.type_ = Type::kList;
  value.items_ = std::move(items);
  return value;
}

PickleValue PickleValue::tuple(Items items) {
  PickleValue value;
  value.type_ = Type::kTuple;
  value.items_ = std::move(items);
  return value;
}

PickleValue PickleValue::dict(Entries entries) {
  PickleValue value;
  value.type_ = Type::kDict;
  for (auto& [key, item] : entries) {
    value.set(std::move(key), std::move(item));
  }
  return value;
}

PickleValue PickleValue::ordered_dict(Entries entries) {
  PickleValue value = dict(std::move(entries));
  value.ordered_ = true;
  return value;
}

std::string PickleValue::type_name() const {
  switch (type_) {
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kDouble: return "float";
    case Type::kString: return "str";
    case Type::kList: return "list";
    case Type::kTuple: return "tuple";
    case Type::kDict: return ordered_ ? "OrderedDict" : "dict";
    case Type::kTensor: return "Tensor";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled PickleValue type ", static_cast<int>(type_));
}

void PickleValue::expect(Type type, const char* what) const {
  DKIT_CHECK(type_ == type, "expected ", what, ", got ", type_name());
}

bool PickleValue::to_bool() const {
  expect(Type::kBool, "a bool");
  return bool_;
}

int64_t PickleValue::to_int() const {
  expect(Type::kInt, "an int");
  return int_;
}

double PickleValue::to_double() const {
  if (type_ == Type::kInt) {
    return static_cast<double>(int_);
  }
  expect(Type::kDouble, "a float");
  return double_;
}

const std::string& PickleValue::to_string() const {
  expect(Type::kString, "a str");
  return string_;
}

const at::Tensor& PickleValue::to_tensor() const {
  expect(Type::kTensor, "a Tensor");
  return tensor_;
}

const std::string& PickleValue::saved_on() const {
  expect(Type::kTensor, "a Tensor");
  return string_;
}

const PickleValue::Items& PickleValue::items() const {
  DKIT_CHECK(type_ == Type::kList || type_ == Type::kTuple, "expected a list or tuple, got ", type_name());
  return items_;
}

PickleValue::Items& PickleValue::items() {
  DKIT_CHECK(type_ == Type::kList || type_ == Type::kTuple, "expected a list or tuple, got ", type_name());
  return items_;
}

const PickleValue::Entries& PickleValue::entries() const {
  expect(Type::kDict, "a dict");
  return entries_;
}

PickleValue::Entries& PickleValue::entries() {
  expect(Type::kDict, "a dict");
  return entries_;
}

const PickleValue* PickleValue::find(std::string_view key) const {
  if (type_ != Type::kDict) {
    return nullptr;
  }
  for (const auto& entry : entries_) {
    if (entry.first.type_ == Type::kString && entry.first.string_ == key) {
      return &entry.second;
    }
  }
  return nullptr;
}

const PickleValue* PickleValue::find(int64_t key) const {
  if (type_ != Type::kDict) {
    return nullptr;
  }
  for (const auto& entry : entries_) {
    if (entry.first.type_ == Type::kInt && entry.first.int_ == key) {
      return &entry.second;
    }
  }
  return nullptr;
}

void PickleValue::set(PickleValue key, PickleValue value) {
  expect(Type::kDict, "a dict");
  DKIT_CHECK(key.is_string() || key.is_int(), "dict keys must be str or int, got ", key.type_name());
  for (auto& entry : entries_) {
    if (entry.first.type_ == key.type_ && entry.first.int_ == key.int_ && entry.first.string_ == key.string_) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

void PickleValue::push_back(PickleValue item) {
  expect(Type::kList, "a list");
  items_.push_back(std::move(item));
}

namespace {

void walk_tensors(const PickleValue& value, const std::string& path,
                  const std::function<void(const std::string&, const PickleValue&)>& fn) {
  const auto child = [&](const std::string& part) { return path.empty() ? part : path + "." + part; };
  switch (value.type()) {
    case PickleValue::Type::kTensor: fn(path, value); break;
    case PickleValue::Type::kList:
    case PickleValue::Type::kTuple:
      for (size_t i = 0; i < value.items().size(); ++i) {
        walk_tensors(value.items()[i], child(std::to_string(i)), fn);
      }
      break;
    case PickleValue::Type::kDict:
      for (const auto& [key, item] : value.entries()) {
        walk_tensors(item, child(key.is_int() ? std::to_string(key.to_int()) : key.to_string()), fn);
      }
      break;
    default: break;
  }
}

} // namespace

void for_each_tensor(const PickleValue& value,
                     const std::function<void(const std::string& path, const PickleValue& tensor)>& fn) {
  walk_tensors(value, "", fn);
}

} // namespace dkit
