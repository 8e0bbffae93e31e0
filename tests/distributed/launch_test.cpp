#include <dkit/distributed/launch.h>

#include "../support.h"

#include <map>
#include <string>

namespace dkit {
namespace {

using test::error_message;

class LaunchEnvironmentTest : public test::SeedingFixture {
 protected:
  /// The variables torchrun sets for the second of two processes on one node.
  std::map<std::string, std::string> vars_{{"RANK", "1"},           {"WORLD_SIZE", "2"},
                                           {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};

  std::optional<LaunchEnvironment> parse() const {
    return parse_launch_environment([this](const char* name) -> const char* {
      const auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    });
  }

  std::string error_with(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      vars_[name] = *value;
    } else {
      vars_.erase(name);
    }
    return error_message([this] { parse(); });
  }
};

TEST_F(LaunchEnvironmentTest, NoRankNorWorldSizeIsASingleProcess) {
  vars_.erase("RANK");
  vars_.erase("WORLD_SIZE");
  EXPECT_FALSE(parse().has_value());
}

TEST_F(LaunchEnvironmentTest, ReadsTheVariablesTorchrunSets) {
  const auto env = parse();
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_FALSE(env->agent_store);
}

TEST_F(LaunchEnvironmentTest, ByHandLocalWorldSizeDefaultsToWorldSize) {
  vars_.erase("LOCAL_WORLD_SIZE");
  vars_["WORLD_SIZE"] = "3";
  EXPECT_EQ(parse()->local_world_size, 3);
}

TEST_F(LaunchEnvironmentTest, TorchrunsAgentStoreIsUsedWithItsAttempt) {
  vars_["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars_["TORCHELASTIC_RESTART_COUNT"] = "2";
  const auto env = parse();
  EXPECT_TRUE(env->agent_store);
  EXPECT_EQ(env->restart_count, 2);
  vars_["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(parse()->agent_store);
}

TEST_F(LaunchEnvironmentTest, MissingVariablesAreNamed) {
  const std::string tail = " is not set: a multi-process run needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                           "MASTER_PORT (torchrun sets them all; set them by hand when starting each process yourself)";
  const auto all = vars_;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    vars_ = all;
    EXPECT_EQ(error_with(name, std::nullopt), name + tail);
  }
}

TEST_F(LaunchEnvironmentTest, BadValuesAreNamedWithTheirValue) {
  EXPECT_EQ(error_with("WORLD_SIZE", "two"), "WORLD_SIZE='two' is not an integer");
  vars_["WORLD_SIZE"] = "2";
  EXPECT_EQ(error_with("WORLD_SIZE", "0"), "WORLD_SIZE=0 must be at least 1");
  vars_["WORLD_SIZE"] = "2";
  EXPECT_EQ(error_with("RANK", "2"), "RANK=2 must be in [0, WORLD_SIZE=2)");
  EXPECT_EQ(error_with("RANK", " 1"), "RANK=' 1' is not an integer");
  EXPECT_EQ(error_with("RANK", ""), "RANK='' is not an integer");
  vars_["RANK"] = "1";
  EXPECT_EQ(error_with("LOCAL_RANK", "-1"), "LOCAL_RANK=-1 must be in [0, WORLD_SIZE=2)");
  vars_["LOCAL_RANK"] = "1";
  EXPECT_EQ(error_with("LOCAL_WORLD_SIZE", "1"), "LOCAL_WORLD_SIZE=1 must be in (LOCAL_RANK=1, WORLD_SIZE=2]");
  vars_["LOCAL_WORLD_SIZE"] = "2";
  EXPECT_EQ(error_with("MASTER_ADDR", ""), "MASTER_ADDR is empty: set it to the host name or address of rank 0's machine");
  vars_["MASTER_ADDR"] = "127.0.0.1";
  EXPECT_EQ(error_with("MASTER_PORT", "70000"), "MASTER_PORT=70000 is not a TCP port: it must be in [1, 65535]");
  EXPECT_EQ(error_with("MASTER_PORT", "0"), "MASTER_PORT=0 is not a TCP port: it must be in [1, 65535]");
  EXPECT_EQ(error_with("MASTER_PORT", "http"), "MASTER_PORT='http' is not an integer");
}

TEST_F(LaunchEnvironmentTest, DeviceOfARank) {
  const auto env = parse();
  EXPECT_EQ(launch_device("cpu", *env), cpu());
  if (num_gpus() == 0) {
    EXPECT_EQ(launch_device("auto", *env), cpu());
    EXPECT_EQ(error_message([&] { launch_device("cuda", *env); }).rfind("device 'cuda' is not available: ", 0), 0u);
  } else if (num_gpus() > 1) {
    EXPECT_EQ(launch_device("auto", *env), gpu(1));
    EXPECT_EQ(launch_device("cuda", *env), gpu(1));
  } else {
    EXPECT_EQ(error_message([&] { launch_device("cuda", *env); }),
              "LOCAL_RANK=1 has no GPU: this process sees 1 (cpu, cuda:0); start at most 1 processes on this node "
              "(torchrun --nproc-per-node), one per GPU");
  }
}

TEST(ResolveHostTest, NamesTheVariableOfAnUnresolvableHost) {
  EXPECT_EQ(resolve_host("127.0.0.1", "MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(resolve_host("localhost", "MASTER_ADDR").rfind("127.", 0) == 0 ||
                resolve_host("localhost", "MASTER_ADDR") == "::1",
            true);
  const std::string message = error_message([] { resolve_host("no-such-host.invalid", "MASTER_ADDR"); });
  EXPECT_EQ(message.rfind("MASTER_ADDR='no-such-host.invalid' cannot be resolved: ", 0), 0u) << message;
}

TEST(ResolveHostTest, LoopbackIsReachedFromLoopback) {
  EXPECT_EQ(local_address_towards("127.0.0.1", 29500), "127.0.0.1");
  EXPECT_EQ(error_message([] { local_address_towards("not-an-ip", 1); }), "'not-an-ip' is not an IP address");
}

} // namespace
} // namespace dkit
