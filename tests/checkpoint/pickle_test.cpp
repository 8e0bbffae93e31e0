#include <dkit/checkpoint/pickle.h>

#include "../support.h"

#include <cstdint>
#include <string>

namespace dkit {
namespace {

using test::error_message;

// Builds pickles opcode by opcode, for inputs that PyTorch would never write.
class Bytes {
 public:
  Bytes& op(int code) {
    data_ += static_cast<char>(code);
    return *this;
  }
  Bytes& u8(int value) {
    return op(value & 0xff);
  }
  Bytes& u32(uint32_t value) {
    for (int i = 0; i < 4; ++i) {
      u8(static_cast<int>(value >> (8 * i)));
    }
    return *this;
  }
  Bytes& proto() {
    return op(0x80).u8(2);
  }
  Bytes& str(const std::string& text) {
    op('X').u32(static_cast<uint32_t>(text.size()));
    data_ += text;
    return *this;
  }
  Bytes& short_str(const std::string& text) {
    op(0x8c).u8(static_cast<int>(text.size()));
    data_ += text;
    return *this;
  }
  Bytes& int1(int value) {
    return op('K').u8(value);
  }
  Bytes& global(const std::string& module, const std::string& name) {
    data_ += 'c' + module + '\n' + name + '\n';
    return *this;
  }
  // ('storage', torch.FloatStorage, key, 'cpu', numel) as a persistent id.
  Bytes& storage(const std::string& key, int numel) {
    op('(').str("storage").global("torch", "FloatStorage").str(key).str("cpu").int1(numel).op('t').op('Q');
    return *this;
  }
  Bytes& stop() {
    return op('.');
  }
  const std::string& str() const {
    return data_;
  }

 private:
  std::string data_;
};

// Storages of zeros, as many elements as the pickle asks for.
c10::Storage zeros_storage(const std::string& /*key*/, c10::ScalarType dtype, int64_t numel,
                           const std::string& /*location*/) {
  return at::zeros({numel}, at::TensorOptions().dtype(dtype)).storage();
}

PickleValue read(const std::string& data, const ReadLimits& limits = {}) {
  return unpickle(data, zeros_storage, "test.pkl", limits);
}

// A tensor pickled as torch.save writes it: _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()).
Bytes tensor_pickle(int numel, int offset, std::vector<int> sizes, std::vector<int> strides) {
  Bytes b;
  b.proto().global("torch._utils", "_rebuild_tensor_v2").op('(').storage("0", numel).int1(offset);
  b.op('(');
  for (int s : sizes) {
    b.int1(s);
  }
  b.op('t').op('(');
  for (int s : strides) {
    b.int1(s);
  }
  b.op('t').op(0x89).global("collections", "OrderedDict").op(')').op('R').op('t').op('R');
  return b.stop();
}

class PickleTest : public test::SeedingFixture {};

TEST_F(PickleTest, RoundTripsEveryType) {
  const auto weight = torch::randn({3, 4});
  PickleValue value = PickleValue::dict({
      {"none", PickleValue()},
      {"yes", true},
      {"no", false},
      {"small", 7},
      {"medium", 40000},
      {"negative", -5},
      {"large", int64_t{1} << 40},
      {"most negative", std::numeric_limits<int64_t>::min()},
      {"pi", 3.141592653589793},
      {"text", "état"},
      {"list", PickleValue::list({1, 2.5, "x"})},
      {"tuple", PickleValue::tuple({1, 2, 3, 4, 5})},
      {"pair", PickleValue::tuple({0.9, 0.999})},
      {7, "int key"},
      {"weights", PickleValue::ordered_dict({{"0.weight", weight}})},
  });
  const Pickled pickled = pickle(value);
  const auto load = [&](const std::string& key, c10::ScalarType dtype, int64_t numel, const std::string& location) {
    EXPECT_EQ(location, "cpu");
    const auto& storage = pickled.storages.at(std::stoul(key));
    EXPECT_EQ(storage.scalar_type(), dtype);
    EXPECT_EQ(storage.numel(), numel);
    return storage.clone().storage();
  };
  const PickleValue back = unpickle(pickled.data, load, "test.pkl");
  ASSERT_TRUE(back.is_dict());
  EXPECT_FALSE(back.is_ordered_dict());
  EXPECT_TRUE(back.find("none")->is_none());
  EXPECT_TRUE(back.find("yes")->to_bool());
  EXPECT_FALSE(back.find("no")->to_bool());
  EXPECT_EQ(back.find("small")->to_int(), 7);
  EXPECT_EQ(back.find("medium")->to_int(), 40000);
  EXPECT_EQ(back.find("negative")->to_int(), -5);
  EXPECT_EQ(back.find("large")->to_int(), int64_t{1} << 40);
  EXPECT_EQ(back.find("most negative")->to_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(back.find("pi")->to_double(), 3.141592653589793);
  EXPECT_EQ(back.find("text")->to_string(), "état");
  EXPECT_EQ(back.find("list")->items().size(), 3u);
  EXPECT_TRUE(back.find("list")->is_list());
  EXPECT_EQ(back.find("list")->items()[1].to_double(), 2.5);
  EXPECT_TRUE(back.find("tuple")->is_tuple());
  EXPECT_EQ(back.find("tuple")->items()[4].to_int(), 5);
  EXPECT_EQ(back.find("pair")->items()[1].to_double(), 0.999);
  EXPECT_EQ(back.find(int64_t{7})->to_string(), "int key");
  const PickleValue* weights = back.find("weights");
  ASSERT_NE(weights, nullptr);
  EXPECT_TRUE(weights->is_ordered_dict());
  EXPECT_TRUE(torch::equal(weights->find("0.weight")->to_tensor(), weight));
  EXPECT_EQ(weights->find("0.weight")->saved_on(), "cpu");
}

TEST_F(PickleTest, ViewsShareTheirStorage) {
  const auto base = torch::arange(12, torch::kFloat).reshape({3, 4});
  PickleValue value = PickleValue::list({base, base.t(), base[1]});
  const Pickled pickled = pickle(value);
  ASSERT_EQ(pickled.storages.size(), 1u);
  const auto load = [&](const std::string&, c10::ScalarType, int64_t, const std::string&) {
    return pickled.storages[0].clone().storage();
  };
  const PickleValue back = unpickle(pickled.data, load, "test.pkl");
  const auto& items = back.items();
  EXPECT_TRUE(torch::equal(items[0].to_tensor(), base));
  EXPECT_TRUE(torch::equal(items[1].to_tensor(), base.t()));
  EXPECT_EQ(items[1].to_tensor().strides().vec(), (std::vector<int64_t>{1, 4}));
  EXPECT_TRUE(torch::equal(items[2].to_tensor(), base[1]));
  EXPECT_EQ(items[2].to_tensor().storage_offset(), 4);
  EXPECT_EQ(items[0].to_tensor().storage().data(), items[2].to_tensor().storage().data());
}

TEST_F(PickleTest, ReadsProtocolFourOpcodesAndTheMemo) {
  Bytes b;
  b.op(0x80).u8(4).op(0x95);
  for (int i = 0; i < 8; ++i) {
    b.u8(0);
  }
  b.op(']').op(0x94).op('(').short_str("a").op(0x94).op('h').u8(1).op('j').u32(1);
  b.short_str("collections").short_str("OrderedDict").op(0x93).op(')').op('R').op('e').stop();
  const PickleValue back = read(b.str());
  ASSERT_EQ(back.items().size(), 4u);
  EXPECT_EQ(back.items()[0].to_string(), "a");
  EXPECT_EQ(back.items()[2].to_string(), "a");
  EXPECT_TRUE(back.items()[3].is_ordered_dict());
}

TEST_F(PickleTest, RefusesGlobalsOutsideTheAllowList) {
  const auto data = Bytes().proto().global("builtins", "eval").str("1+1").op(0x85).op('R').stop().str();
  EXPECT_EQ(error_message([&] { read(data); }),
            "test.pkl: refusing the pickle global 'builtins.eval': only tensors, containers, numbers and strings can "
            "be loaded (as with torch.load(weights_only=True)); nothing was executed");
  const auto stacked = Bytes().proto().str("posix").str("system").op(0x93).stop().str();
  EXPECT_EQ(error_message([&] { read(stacked); }),
            "test.pkl: refusing the pickle global 'posix.system': only tensors, containers, numbers and strings can "
            "be loaded (as with torch.load(weights_only=True)); nothing was executed");
}

TEST_F(PickleTest, RefusesCallingAStorageType) {
  const auto data = Bytes().proto().global("torch", "FloatStorage").op(')').op('R').stop().str();
  EXPECT_EQ(error_message([&] { read(data); }),
            "test.pkl: corrupt pickle: REDUCE calling torch.FloatStorage, which is not callable here at byte 23");
}

TEST_F(PickleTest, RebuildsATensorWithinItsStorage) {
  const PickleValue value = read(tensor_pickle(12, 2, {2, 3}, {4, 1}).str());
  ASSERT_TRUE(value.is_tensor());
  EXPECT_EQ(value.to_tensor().sizes().vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(value.to_tensor().storage_offset(), 2);
}

TEST_F(PickleTest, RejectsATensorReachingPastItsStorage) {
  EXPECT_EQ(error_message([] { read(tensor_pickle(6, 1, {2, 3}, {3, 1}).str()); }),
            "test.pkl: a tensor with offset 1, sizes [2, 3] and strides [3, 1] over storage '0' of 6 elements: it "
            "reaches past the end of its storage");
  EXPECT_EQ(error_message([] { read(tensor_pickle(6, 0, {4}, {2}).str()); }),
            "test.pkl: a tensor with offset 0, sizes [4] and strides [2] over storage '0' of 6 elements: it reaches "
            "past the end of its storage");
  EXPECT_EQ(error_message([] { read(tensor_pickle(6, 7, {0}, {1}).str()); }),
            "test.pkl: a tensor with offset 7, sizes [0] and strides [1] over storage '0' of 6 elements: it reaches "
            "past the end of its storage");
}

TEST_F(PickleTest, RejectsOverflowingTensorGeometry) {
  Bytes b;
  b.proto().global("torch._utils", "_rebuild_tensor_v2").op('(').storage("0", 4).int1(0);
  b.op('(').op(0x8a).u8(8).u32(0xffffffff).u32(0x3fffffff).int1(2).op('t');
  b.op('(').op(0x8a).u8(8).u32(0xffffffff).u32(0x3fffffff).int1(1).op('t');
  b.op(0x89).global("collections", "OrderedDict").op(')').op('R').op('t').op('R').stop();
  EXPECT_EQ(error_message([&] { read(b.str()); }),
            "test.pkl: a tensor with offset 0, sizes [4611686018427387903, 2] and strides [4611686018427387903, 1] "
            "over storage '0' of 4 elements: negative or overflowing values");
}

TEST_F(PickleTest, RejectsAPersistentIdThatIsNotAStorage) {
  const auto data = Bytes().proto().op('(').str("module").str("x").op('t').op('Q').stop().str();
  EXPECT_EQ(error_message([&] { read(data); }),
            "test.pkl: corrupt pickle: a persistent id that is not ('storage', type, key, location, numel) at byte 21");
}

TEST_F(PickleTest, ReportsTruncatedData) {
  std::string data = Bytes().proto().str("hello").stop().str();
  data.resize(data.size() - 3);
  EXPECT_EQ(error_message([&] { read(data); }),
            "test.pkl: corrupt pickle: the data ends inside a BINUNICODE string at byte 7");
  EXPECT_EQ(error_message([] { read(Bytes().proto().int1(1).str()); }),
            "test.pkl: corrupt pickle: the data ends inside an opcode at byte 4");
}

TEST_F(PickleTest, ReportsUnsupportedOpcodes) {
  EXPECT_EQ(error_message([] { read(Bytes().proto().op('I').stop().str()); }),
            "test.pkl: corrupt pickle: unsupported opcode 0x49 at byte 2");
}

TEST_F(PickleTest, RejectsUnsupportedDictKeys) {
  const auto data = Bytes().proto().op('}').op(')').int1(1).op('s').stop().str();
  EXPECT_EQ(error_message([&] { read(data); }),
            "test.pkl: corrupt pickle: a dict key of type tuple (only str and int keys are supported) at byte 6");
}

TEST_F(PickleTest, LimitsPickleSize) {
  const auto data = Bytes().proto().str("a string of some length").stop().str();
  EXPECT_EQ(error_message([&] { read(data, ReadLimits().max_pickle_bytes(16)); }),
            "test.pkl: the pickle is 31 bytes, more than the limit of 16 (max_pickle_bytes)");
}

TEST_F(PickleTest, LimitsNestingDepth) {
  const PickleValue deep = PickleValue::list({PickleValue::list({PickleValue::list({PickleValue::list({1})})})});
  const auto data = pickle(deep).data;
  EXPECT_EQ(read(data, ReadLimits().max_depth(4)).items()[0].items()[0].items()[0].items()[0].to_int(), 1);
  EXPECT_EQ(error_message([&] { read(data, ReadLimits().max_depth(3)); }),
            "test.pkl: the pickle nests deeper than 3 levels (max_depth)");
}

TEST_F(PickleTest, SelfReferenceIsAnErrorNotAHang) {
  const auto data = Bytes().proto().op(']').op('q').u8(0).op('h').u8(0).op('a').stop().str();
  EXPECT_EQ(error_message([&] { read(data); }), "test.pkl: the pickle nests deeper than 100 levels (max_depth)");
}

// Lists nested 300000 deep without a single MARK (`]` opens a list, `a` appends it to the one below): the depth
// limit refuses them, and freeing them must not recurse once per level, which overflowed the stack.
TEST_F(PickleTest, DeeplyNestedListsAreAnErrorNotAStackOverflow) {
  constexpr int kLevels = 300000;
  std::string data = Bytes().proto().str();
  data.append(kLevels, ']');
  data.append(kLevels - 1, 'a');
  data += '.';
  EXPECT_EQ(error_message([&] { read(data); }), "test.pkl: the pickle nests deeper than 100 levels (max_depth)");
}

// A list that holds itself (SelfReferenceIsAnErrorNotAHang) is a cycle of shared pointers inside the unpickler;
// under scripts/sanitize.sh LeakSanitizer checks that it is freed. Here: a dict that holds itself, read whole.
TEST_F(PickleTest, ContainersThatHoldThemselvesAreFreed) {
  const auto data = Bytes().proto().op('}').op('q').u8(0).short_str("self").op('h').u8(0).op('s').stop().str();
  EXPECT_EQ(error_message([&] { read(data); }), "test.pkl: the pickle nests deeper than 100 levels (max_depth)");
}

TEST_F(PickleTest, LimitsMemoEntries) {
  const auto data = Bytes().proto().int1(1).op('q').u8(0).op('q').u8(1).op('q').u8(2).stop().str();
  EXPECT_EQ(read(data, ReadLimits().max_memo(3)).to_int(), 1);
  EXPECT_EQ(error_message([&] { read(data, ReadLimits().max_memo(2)); }),
            "test.pkl: the pickle memo holds more than 2 entries (max_memo)");
}

TEST_F(PickleTest, LimitsValueCountIncludingSharedValues) {
  Bytes b;
  b.proto().op(']').op('(').int1(1).int1(2).op('e').op('q').u8(0);
  for (int level = 1; level <= 30; ++level) {
    b.op('h').u8(level - 1).op('h').u8(level - 1).op(0x86).op('q').u8(level);
  }
  const auto data = b.stop().str();
  EXPECT_EQ(error_message([&] { read(data, ReadLimits().max_values(1000)); }),
            "test.pkl: the pickle holds more than 1000 values (max_values)");
  const auto few = Bytes().proto().op(']').op('(').int1(1).int1(2).int1(3).op('e').stop().str();
  EXPECT_EQ(read(few, ReadLimits().max_values(4)).items().size(), 3u);
  EXPECT_EQ(error_message([&] { read(few, ReadLimits().max_values(3)); }),
            "test.pkl: the pickle holds more than 3 values (max_values)");
}

TEST_F(PickleTest, NamesDtypesAsPython) {
  EXPECT_EQ(dtype_name(torch::kFloat), "float32");
  EXPECT_EQ(dtype_name(torch::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(torch::kHalf), "float16");
  EXPECT_EQ(dtype_name(torch::kLong), "int64");
  EXPECT_EQ(dtype_name(torch::kByte), "uint8");
}

TEST_F(PickleTest, WalksTensorsWithDottedPaths) {
  const PickleValue value = PickleValue::dict(
      {{"model", PickleValue::ordered_dict({{"0.weight", torch::zeros({1})}})},
       {"state", PickleValue::dict({{0, PickleValue::dict({{"exp_avg", torch::zeros({1})}})}})},
       {"list", PickleValue::list({1, torch::zeros({1})})}});
  std::vector<std::string> paths;
  for_each_tensor(value, [&](const std::string& path, const PickleValue&) { paths.push_back(path); });
  EXPECT_EQ(paths, (std::vector<std::string>{"model.0.weight", "state.0.exp_avg", "list.1"}));
}

TEST_F(PickleTest, TypeErrorsNameBothTypes) {
  EXPECT_EQ(error_message([] { PickleValue("x").to_int(); }), "expected an int, got str");
  EXPECT_EQ(error_message([] { PickleValue(true).to_int(); }), "expected an int, got bool");
  EXPECT_EQ(error_message([] { PickleValue::dict().set(1.5, 1); }), "dict keys must be str or int, got float");
  EXPECT_EQ(PickleValue(3).to_double(), 3.0);
}

} // namespace
} // namespace dkit
