#include <dkit/checkpoint/unpickler.h>

#include <dkit/checkpoint/detail/pickle_storage_types.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

namespace dkit {
namespace {

// Storage type names torch.save writes (`torch.FloatStorage`, ...) and their element types.
const std::map<std::string, c10::ScalarType, std::less<>>& storage_types() {
  static const std::map<std::string, c10::ScalarType, std::less<>> types = [] {
    std::map<std::string, c10::ScalarType, std::less<>> names;
    for (const auto& type : detail::kStorageTypes) {
      names.emplace("torch." + std::string(type.name), type.dtype);
    }
    names.emplace("torch.UntypedStorage", c10::kByte);
    names.emplace("torch.storage.UntypedStorage", c10::kByte);
    return names;
  }();
  return types;
}

constexpr std::string_view kOrderedDict = "collections.OrderedDict";
constexpr std::string_view kRebuildTensor = "torch._utils._rebuild_tensor_v2";
constexpr std::string_view kRebuildParameter = "torch._utils._rebuild_parameter";
constexpr std::string_view kRebuildParameterWithState = "torch._utils._rebuild_parameter_with_state";
constexpr std::string_view kSize = "torch.Size";

bool is_allowed_global(std::string_view name) {
  return name == kOrderedDict || name == kRebuildTensor || name == kRebuildParameter ||
         name == kRebuildParameterWithState || name == kSize || storage_types().count(name) != 0;
}

// The unpickler's working objects. Containers are shared, as in Python, because the memo refers to the same
// object that later opcodes fill in; the result is copied into a PickleValue tree once the pickle is read.
struct Obj;
using ObjPtr = std::shared_ptr<Obj>;

struct Obj {
  enum class Kind { kNone, kBool, kInt, kDouble, kString, kList, kTuple, kDict, kTensor, kGlobal, kStorage };
  explicit Obj(Kind k) : kind(k) {}
  ~Obj();
  Obj(const Obj&) = delete;
  Obj& operator=(const Obj&) = delete;

  // Moves the references this container holds to `out`, leaving it empty.
  void release_children(std::vector<ObjPtr>& out) {
    for (auto& item : items) {
      out.push_back(std::move(item));
    }
    for (auto& [key, value] : entries) {
      out.push_back(std::move(key));
      out.push_back(std::move(value));
    }
    items.clear();
    entries.clear();
    index.clear();
  }

  Kind kind;
  bool ordered = false;
  bool flag = false;
  int64_t number = 0;
  double real = 0.0;
  std::string text;  // str value, global name, storage key or tensor/storage location
  std::vector<ObjPtr> items;
  std::vector<std::pair<ObjPtr, ObjPtr>> entries;
  std::unordered_map<std::string, size_t> index;
  at::Tensor tensor;
  c10::Storage storage;
  c10::ScalarType dtype = c10::kByte;
  std::string location;
};

// Destroys the containers this one held one by one, not recursively: a hostile pickle can nest lists a million
// levels deep (each `]` opcode one level, each `a` one link), far beyond what the stack holds.
Obj::~Obj() {
  std::vector<ObjPtr> pending;
  release_children(pending);
  while (!pending.empty()) {
    ObjPtr obj = std::move(pending.back());
    pending.pop_back();
    if (obj != nullptr && obj.use_count() == 1) {
      obj->release_children(pending);
    }
  }
}

std::string obj_type_name(const Obj& obj) {
  switch (obj.kind) {
    case Obj::Kind::kNone: return "NoneType";
    case Obj::Kind::kBool: return "bool";
    case Obj::Kind::kInt: return "int";
    case Obj::Kind::kDouble: return "float";
    case Obj::Kind::kString: return "str";
    case Obj::Kind::kList: return "list";
    case Obj::Kind::kTuple: return "tuple";
    case Obj::Kind::kDict: return obj.ordered ? "OrderedDict" : "dict";
    case Obj::Kind::kTensor: return "Tensor";
    case Obj::Kind::kGlobal: return "global " + obj.text;
    case Obj::Kind::kStorage: return "storage";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled Obj kind");
}

class Unpickler {
 public:
  Unpickler(std::string_view data, const StorageLoader& load_storage, const std::string& source,
            const ReadLimits& limits)
      : data_(data), load_storage_(load_storage), source_(source), limits_(limits) {}

  // A pickle can make a container hold itself (a memo reference appended to it): empty every container reachable
  // from the stack and the memo, or those cycles of shared pointers would never be freed.
  ~Unpickler() {
    std::vector<ObjPtr> reachable(stack_.begin(), stack_.end());
    for (const auto& [index, obj] : memo_) {
      reachable.push_back(obj);
    }
    std::unordered_set<const Obj*> seen;
    std::vector<ObjPtr> containers;
    while (!reachable.empty()) {
      ObjPtr obj = std::move(reachable.back());
      reachable.pop_back();
      if (obj == nullptr || !seen.insert(obj.get()).second) {
        continue;
      }
      for (const auto& item : obj->items) {
        reachable.push_back(item);
      }
      for (const auto& [key, value] : obj->entries) {
        reachable.push_back(key);
        reachable.push_back(value);
      }
      containers.push_back(std::move(obj));
    }
    std::vector<ObjPtr> released;
    for (const auto& obj : containers) {
      obj->release_children(released);
    }
  }

  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;

  PickleValue run() {
    DKIT_CHECK(static_cast<int64_t>(data_.size()) <= limits_.max_pickle_bytes(), source_, ": the pickle is ",
               data_.size(), " bytes, more than the limit of ", limits_.max_pickle_bytes(), " (max_pickle_bytes)");
    while (true) {
      op_at_ = pos_;
      const auto op = static_cast<uint8_t>(read(1, "an opcode")[0]);
      if (op == '.') {
        break;
      }
      step(op);
    }
    if (stack_.empty()) {
      fail("STOP with an empty stack");
    }
    int64_t count = 0;
    return convert(*stack_.back(), 0, count);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(detail::concat(source_, ": corrupt pickle: ", what, " at byte ", op_at_));
  }

  std::string_view read(size_t n, const char* what) {
    if (n > data_.size() - pos_) {
      op_at_ = pos_;
      fail(detail::concat("the data ends inside ", what));
    }
    const auto out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  uint64_t read_uint(size_t n, const char* what) {
    const auto bytes = read(n, what);
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) {
      value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
    }
    return value;
  }

  std::string_view read_line(const char* what) {
    const auto end = data_.find('\n', pos_);
    if (end == std::string_view::npos) {
      op_at_ = pos_;
      fail(detail::concat("the data ends inside ", what));
    }
    const auto line = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }

  ObjPtr make(Obj::Kind kind) {
    if (++objects_ > limits_.max_values()) {
      throw Error(detail::concat(source_, ": the pickle holds more than ", limits_.max_values(),
                                 " values (max_values)"));
    }
    return std::make_shared<Obj>(kind);
  }

  void push(ObjPtr obj) {
    stack_.push_back(std::move(obj));
  }

  ObjPtr pop() {
    if (stack_.size() <= stack_floor()) {
      fail("pop from an empty stack");
    }
    auto obj = std::move(stack_.back());
    stack_.pop_back();
    return obj;
  }

  Obj& top() {
    if (stack_.size() <= stack_floor()) {
      fail("an opcode needs a value but the stack is empty");
    }
    return *stack_.back();
  }

  size_t stack_floor() const {
    return marks_.empty() ? 0 : marks_.back();
  }

  std::vector<ObjPtr> pop_mark() {
    if (marks_.empty()) {
      fail("no MARK to pop to");
    }
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ObjPtr> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(mark)),
                              std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  void push_int(int64_t value) {
    auto obj = make(Obj::Kind::kInt);
    obj->number = value;
    push(std::move(obj));
  }

  void push_string(std::string_view value) {
    auto obj = make(Obj::Kind::kString);
    obj->text = std::string(value);
    push(std::move(obj));
  }

  void push_tuple(std::vector<ObjPtr> items) {
    auto obj = make(Obj::Kind::kTuple);
    obj->items = std::move(items);
    push(std::move(obj));
  }

  void memo_put(uint64_t index) {
    if (stack_.empty()) {
      fail("memoizing with an empty stack");
    }
    if (memo_.count(index) == 0 && static_cast<int64_t>(memo_.size()) >= limits_.max_memo()) {
      throw Error(detail::concat(source_, ": the pickle memo holds more than ", limits_.max_memo(),
                                 " entries (max_memo)"));
    }
    memo_[index] = stack_.back();
  }

  void memo_get(uint64_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) {
      fail(detail::concat("memo entry ", index, " does not exist"));
    }
    push(found->second);
  }

  static std::string key_id(const Obj& key) {
    return key.kind == Obj::Kind::kInt ? "i" + std::to_string(key.number) : "s" + key.text;
  }

  void set_item(Obj& dict, ObjPtr key, ObjPtr value) {
    if (dict.kind != Obj::Kind::kDict) {
      fail("SETITEM on a " + obj_type_name(dict));
    }
    if (key->kind != Obj::Kind::kString && key->kind != Obj::Kind::kInt) {
      fail("a dict key of type " + obj_type_name(*key) + " (only str and int keys are supported)");
    }
    const auto id = key_id(*key);
    const auto found = dict.index.find(id);
    if (found != dict.index.end()) {
      dict.entries[found->second].second = std::move(value);
      return;
    }
    dict.index.emplace(id, dict.entries.size());
    dict.entries.emplace_back(std::move(key), std::move(value));
  }

  void push_global(std::string module, std::string_view name) {
    auto full = module + "." + std::string(name);
    if (!is_allowed_global(full)) {
      throw Error(detail::concat(source_, ": refusing the pickle global '", full,
                                 "': only tensors, containers, numbers and strings can be loaded (as with "
                                 "torch.load(weights_only=True)); nothing was executed"));
    }
    auto obj = make(Obj::Kind::kGlobal);
    obj->text = std::move(full);
    push(std::move(obj));
  }

  int64_t int_arg(const Obj& obj, const char* what) const {
    if (obj.kind != Obj::Kind::kInt) {
      fail(detail::concat(what, " is a ", obj_type_name(obj), ", not an int"));
    }
    return obj.number;
  }

  std::vector<int64_t> int_tuple_arg(const Obj& obj, const char* what) const {
    if (obj.kind != Obj::Kind::kTuple && obj.kind != Obj::Kind::kList) {
      fail(detail::concat(what, " is a ", obj_type_name(obj), ", not a tuple"));
    }
    std::vector<int64_t> values;
    for (const auto& item : obj.items) {
      values.push_back(int_arg(*item, what));
    }
    return values;
  }

  void persistent_load() {
    const auto pid = pop();
    if (pid->kind != Obj::Kind::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Obj::Kind::kString ||
        pid->items[0]->text != "storage") {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    const Obj& type = *pid->items[1];
    const Obj& key = *pid->items[2];
    const Obj& location = *pid->items[3];
    if (type.kind != Obj::Kind::kGlobal || storage_types().count(type.text) == 0) {
      fail("a persistent id whose storage type is a " + obj_type_name(type));
    }
    if (key.kind != Obj::Kind::kString || location.kind != Obj::Kind::kString) {
      fail("a persistent id whose key or location is not a str");
    }
    const int64_t numel = int_arg(*pid->items[4], "a storage's size");
    if (numel < 0) {
      fail("a storage of negative size");
    }
    const c10::ScalarType dtype = storage_types().find(type.text)->second;
    auto& cached = storages_[key.text];
    if (cached == nullptr) {
      cached = make(Obj::Kind::kStorage);
      cached->storage = load_storage_(key.text, dtype, numel, location.text);
      cached->dtype = dtype;
      cached->number = numel;
      cached->text = key.text;
      cached->location = location.text;
      TORCH_INTERNAL_ASSERT(cached->storage.nbytes() == static_cast<size_t>(numel) * c10::elementSize(dtype),
                            "storage loader returned ", cached->storage.nbytes(), " bytes for ", numel, " elements");
    } else if (cached->dtype != dtype || cached->number != numel) {
      throw Error(detail::concat(source_, ": storage '", key.text, "' is used both as ", cached->number, " ",
                                 dtype_name(cached->dtype), " and as ", numel, " ", dtype_name(dtype)));
    }
    push(cached);
  }

  ObjPtr rebuild_tensor(const std::vector<ObjPtr>& args) {
    if (args.size() != 6 && args.size() != 7) {
      fail(detail::concat("_rebuild_tensor_v2 with ", args.size(), " arguments"));
    }
    const Obj& storage = *args[0];
    if (storage.kind != Obj::Kind::kStorage) {
      fail("_rebuild_tensor_v2 over a " + obj_type_name(storage) + " instead of a storage");
    }
    const int64_t offset = int_arg(*args[1], "a tensor's storage offset");
    const auto sizes = int_tuple_arg(*args[2], "a tensor's size");
    const auto strides = int_tuple_arg(*args[3], "a tensor's stride");
    const auto where = [&] {
      return detail::concat(source_, ": a tensor with offset ", offset, ", sizes ", c10::IntArrayRef(sizes),
                            " and strides ", c10::IntArrayRef(strides), " over storage '", storage.text, "' of ",
                            storage.number, " elements");
    };
    DKIT_CHECK(sizes.size() == strides.size(), where(), ": sizes and strides differ in length");
    int64_t last = offset;
    bool empty = false;
    bool overflow = offset < 0;
    for (size_t d = 0; d < sizes.size() && !overflow; ++d) {
      overflow = sizes[d] < 0 || strides[d] < 0;
      empty = empty || sizes[d] == 0;
      int64_t step = 0;
      overflow = overflow || __builtin_mul_overflow(sizes[d] == 0 ? 0 : sizes[d] - 1, strides[d], &step) ||
                 __builtin_add_overflow(last, step, &last);
    }
    DKIT_CHECK(!overflow, where(), ": negative or overflowing values");
    DKIT_CHECK(empty ? offset <= storage.number : last < storage.number, where(),
               ": it reaches past the end of its storage");
    auto tensor = at::empty({0}, at::TensorOptions().dtype(storage.dtype).device(storage.storage.device()));
    tensor.set_(storage.storage, offset, sizes, strides);
    auto obj = make(Obj::Kind::kTensor);
    obj->tensor = std::move(tensor);
    obj->location = storage.location;
    return obj;
  }

  void reduce() {
    const auto args = pop();
    const auto callable = pop();
    if (callable->kind != Obj::Kind::kGlobal) {
      fail("REDUCE calling a " + obj_type_name(*callable));
    }
    if (args->kind != Obj::Kind::kTuple) {
      fail("REDUCE with arguments in a " + obj_type_name(*args));
    }
    const auto& name = callable->text;
    const auto& items = args->items;
    if (name == kOrderedDict) {
      auto dict = make(Obj::Kind::kDict);
      dict->ordered = true;
      if (items.size() == 1 && (items[0]->kind == Obj::Kind::kList || items[0]->kind == Obj::Kind::kTuple)) {
        for (const auto& pair : items[0]->items) {
          if (pair->kind != Obj::Kind::kTuple || pair->items.size() != 2) {
            fail("OrderedDict built from something other than (key, value) pairs");
          }
          set_item(*dict, pair->items[0], pair->items[1]);
        }
      } else if (!items.empty()) {
        fail(detail::concat("OrderedDict called with ", items.size(), " arguments"));
      }
      push(std::move(dict));
    } else if (name == kRebuildTensor) {
      push(rebuild_tensor(items));
    } else if (name == kRebuildParameter || name == kRebuildParameterWithState) {
      if (items.size() != (name == kRebuildParameter ? 3u : 4u) || items[0]->kind != Obj::Kind::kTensor) {
        fail(name + " with unexpected arguments");
      }
      push(items[0]);
    } else if (name == kSize) {
      if (items.size() != 1) {
        fail("torch.Size with unexpected arguments");
      }
      std::vector<ObjPtr> dims;
      for (const int64_t d : int_tuple_arg(*items[0], "a torch.Size entry")) {
        auto dim = make(Obj::Kind::kInt);
        dim->number = d;
        dims.push_back(std::move(dim));
      }
      push_tuple(std::move(dims));
    } else {
      fail("REDUCE calling " + name + ", which is not callable here");
    }
  }

  void build() {
    const auto state = pop();
    const Obj& target = top();
    if (target.kind == Obj::Kind::kDict && (state->kind == Obj::Kind::kDict || state->kind == Obj::Kind::kNone)) {
      return;  // an OrderedDict's attributes (state_dict()'s `_metadata`): not part of the data
    }
    if (target.kind == Obj::Kind::kTensor && state->kind == Obj::Kind::kNone) {
      return;
    }
    fail("BUILD of a " + obj_type_name(target) + " from a " + obj_type_name(*state));
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto version = static_cast<uint8_t>(read(1, "PROTO")[0]);
        if (version < 2 || version > 5) {
          fail(detail::concat("pickle protocol ", static_cast<int>(version), " (2 to 5 are read)"));
        }
        break;
      }
      case 0x95: read(8, "FRAME"); break;  // FRAME: the frame's length; the data follows inline
      case '(':
        if (static_cast<int64_t>(marks_.size()) >= limits_.max_depth()) {
          throw Error(detail::concat(source_, ": the pickle nests deeper than ", limits_.max_depth(),
                                     " levels (max_depth)"));
        }
        marks_.push_back(stack_.size());
        break;
      case '0': pop(); break;  // POP
      case 'N': push(make(Obj::Kind::kNone)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        auto obj = make(Obj::Kind::kBool);
        obj->flag = op == 0x88;
        push(std::move(obj));
        break;
      }
      case 'J': push_int(static_cast<int32_t>(read_uint(4, "BININT"))); break;
      case 'K': push_int(static_cast<int64_t>(read_uint(1, "BININT1"))); break;
      case 'M': push_int(static_cast<int64_t>(read_uint(2, "BININT2"))); break;
      case 0x8a: {  // LONG1: little-endian two's complement
        const auto n = static_cast<size_t>(read_uint(1, "LONG1"));
        if (n > 8) {
          fail(detail::concat("an integer of ", n, " bytes (at most 8 are read)"));
        }
        const auto bytes = read(n, "LONG1");
        uint64_t value = 0;
        for (size_t i = 0; i < n; ++i) {
          value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
        }
        if (n > 0 && n < 8 && (static_cast<uint8_t>(bytes[n - 1]) & 0x80) != 0) {
          value |= ~uint64_t{0} << (8 * n);
        }
        push_int(static_cast<int64_t>(value));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian IEEE double
        const auto bytes = read(8, "BINFLOAT");
        uint64_t bits = 0;
        for (size_t i = 0; i < 8; ++i) {
          bits = (bits << 8) | static_cast<uint8_t>(bytes[i]);
        }
        auto obj = make(Obj::Kind::kDouble);
        std::memcpy(&obj->real, &bits, sizeof(bits));
        push(std::move(obj));
        break;
      }
      case 'X': push_string(read(read_uint(4, "BINUNICODE"), "a BINUNICODE string")); break;
      case 0x8c: push_string(read(read_uint(1, "SHORT_BINUNICODE"), "a SHORT_BINUNICODE string")); break;
      case 0x8d: push_string(read(read_uint(8, "BINUNICODE8"), "a BINUNICODE8 string")); break;
      case 'U': push_string(read(read_uint(1, "SHORT_BINSTRING"), "a SHORT_BINSTRING string")); break;
      case ')': push_tuple({}); break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const size_t n = op - 0x84u;
        if (stack_.size() < stack_floor() + n) {
          fail(detail::concat("TUPLE", n, " with fewer than ", n, " values on the stack"));
        }
        std::vector<ObjPtr> items(std::make_move_iterator(stack_.end() - static_cast<std::ptrdiff_t>(n)),
                                  std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - n);
        push_tuple(std::move(items));
        break;
      }
      case 't': push_tuple(pop_mark()); break;
      case ']': push(make(Obj::Kind::kList)); break;
      case 'l': {
        auto list = make(Obj::Kind::kList);
        list->items = pop_mark();
        push(std::move(list));
        break;
      }
      case '}': push(make(Obj::Kind::kDict)); break;
      case 'd': {
        auto items = pop_mark();
        if (items.size() % 2 != 0) {
          fail("DICT with an odd number of values");
        }
        auto dict = make(Obj::Kind::kDict);
        for (size_t i = 0; i < items.size(); i += 2) {
          set_item(*dict, items[i], items[i + 1]);
        }
        push(std::move(dict));
        break;
      }
      case 'a': {
        auto item = pop();
        Obj& list = top();
        if (list.kind != Obj::Kind::kList) {
          fail("APPEND to a " + obj_type_name(list));
        }
        list.items.push_back(std::move(item));
        break;
      }
      case 'e': {
        auto items = pop_mark();
        Obj& list = top();
        if (list.kind != Obj::Kind::kList) {
          fail("APPENDS to a " + obj_type_name(list));
        }
        list.items.insert(list.items.end(), items.begin(), items.end());
        break;
      }
      case 's': {
        auto value = pop();
        auto key = pop();
        set_item(top(), std::move(key), std::move(value));
        break;
      }
      case 'u': {
        auto items = pop_mark();
        if (items.size() % 2 != 0) {
          fail("SETITEMS with an odd number of values");
        }
        Obj& dict = top();
        for (size_t i = 0; i < items.size(); i += 2) {
          set_item(dict, items[i], items[i + 1]);
        }
        break;
      }
      case 'c': {  // GLOBAL
        std::string module(read_line("GLOBAL"));
        push_global(std::move(module), read_line("GLOBAL"));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const auto name = pop();
        const auto module = pop();
        if (module->kind != Obj::Kind::kString || name->kind != Obj::Kind::kString) {
          fail("STACK_GLOBAL with a module or name that is not a str");
        }
        push_global(module->text, name->text);
        break;
      }
      case 'R': reduce(); break;
      case 'b': build(); break;
      case 'Q': persistent_load(); break;
      case 'q': memo_put(read_uint(1, "BINPUT")); break;
      case 'r': memo_put(read_uint(4, "LONG_BINPUT")); break;
      case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
      case 'h': memo_get(read_uint(1, "BINGET")); break;
      case 'j': memo_get(read_uint(4, "LONG_BINGET")); break;
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", op);
        fail(detail::concat("unsupported opcode ", hex));
      }
    }
  }

  PickleValue convert(const Obj& obj, int64_t depth, int64_t& count) const {
    if (++count > limits_.max_values()) {
      throw Error(detail::concat(source_, ": the pickle holds more than ", limits_.max_values(),
                                 " values (max_values)"));
    }
    if (depth > limits_.max_depth()) {
      throw Error(detail::concat(source_, ": the pickle nests deeper than ", limits_.max_depth(),
                                 " levels (max_depth)"));
    }
    switch (obj.kind) {
      case Obj::Kind::kNone: return {};
      case Obj::Kind::kBool: return PickleValue(obj.flag);
      case Obj::Kind::kInt: return PickleValue(obj.number);
      case Obj::Kind::kDouble: return PickleValue(obj.real);
      case Obj::Kind::kString: return PickleValue(obj.text);
      case Obj::Kind::kTensor: return PickleValue(obj.tensor, obj.location);
      case Obj::Kind::kList:
      case Obj::Kind::kTuple: {
        PickleValue::Items items;
        items.reserve(obj.items.size());
        for (const auto& item : obj.items) {
          items.push_back(convert(*item, depth + 1, count));
        }
        return obj.kind == Obj::Kind::kList ? PickleValue::list(std::move(items))
                                            : PickleValue::tuple(std::move(items));
      }
      case Obj::Kind::kDict: {
        PickleValue dict = obj.ordered ? PickleValue::ordered_dict() : PickleValue::dict();
        auto& entries = dict.entries();
        entries.reserve(obj.entries.size());
        for (const auto& [key, value] : obj.entries) {
          entries.emplace_back(convert(*key, depth + 1, count), convert(*value, depth + 1, count));
        }
        return dict;
      }
      case Obj::Kind::kGlobal:
      case Obj::Kind::kStorage:
        throw Error(detail::concat(source_, ": the pickle holds a bare ", obj_type_name(obj),
                                   " (only tensors, containers, numbers and strings are read)"));
    }
    TORCH_INTERNAL_ASSERT(false, "unhandled Obj kind");
  }

  std::string_view data_;
  const StorageLoader& load_storage_;
  const std::string& source_;
  const ReadLimits& limits_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  int64_t objects_ = 0;
  std::vector<ObjPtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ObjPtr> memo_;
  std::unordered_map<std::string, ObjPtr> storages_;
};

} // namespace

PickleValue unpickle(std::string_view data, const StorageLoader& load_storage, const std::string& source,
                     const ReadLimits& limits) {
  return Unpickler(data, load_storage, source, limits).run();
}

} // namespace dkit
