#include <dkit/train/detail/rank_agreement.h>

#include <dkit/core/error.h>
#include <dkit/distributed/process_group.h>
#include <dkit/device/host_sync.h>

#include <torch/nn/module.h>
#include <torch/torch.h>

namespace dkit::detail {

void agree_on_start(ProcessGroupContext& group, torch::nn::Module& model, const std::vector<StartFact>& facts,
                    const Device& device) {
  broadcast_module(group, model);
  std::vector<int64_t> mine;
  for (const auto& fact : facts) {
    mine.push_back(fact.value);
  }
  auto theirs = torch::tensor(mine, torch::kInt64).to(device);
  group.broadcast({theirs}, "the broadcast of rank 0's starting point");
  const auto host = theirs.to(torch::kCPU);
  note_host_sync();
  const auto shown = [](const StartFact& fact, int64_t value) {
    return fact.hashed ? "hash " + std::to_string(value) : std::to_string(value);
  };
  for (size_t i = 0; i < facts.size(); ++i) {
    const int64_t rank0 = host.data_ptr<int64_t>()[i];
    DKIT_CHECK(rank0 == mine[i], "rank ", group.rank(), " does not start where rank 0 does: its ", facts[i].name,
               " differs (", shown(facts[i], mine[i]), ", rank 0: ", shown(facts[i], rank0),
               "); every rank must be given the same config, data and checkpoint folder");
  }
}

int64_t fingerprint(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  return static_cast<int64_t>(hash >> 1);
}

} // namespace dkit::detail
