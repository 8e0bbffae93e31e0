// Prints what the Loader and MetricBuffer cost per batch on this machine: alone, and inside an MLP training step
// (hidden [256, 256], Adam, batch 64) compared with the same step on one fixed batch. Not a test: it measures, it
// does not judge. Every configuration runs in ROUNDS interleaved rounds; the median and the best round are shown,
// so that other processes on a shared machine disturb the figures less.
//
//   dkit_loader_cost [DIGITS_CSV] [STEPS_PER_ROUND] [ROUNDS] [THREADS]
#include <dkit/dkit.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Runs `count` units of work and returns the time they took.
using Work = std::function<Clock::duration(int64_t count)>;

struct Case {
  std::string name;
  Work work;
  std::vector<double> micros;
  // Time spent in Loader::next() during the last work() call, for the training cases.
  std::shared_ptr<Clock::duration> in_next = std::make_shared<Clock::duration>();
  std::vector<double> next_micros;

  Case(std::string case_name, Work case_work) : name(std::move(case_name)), work(std::move(case_work)) {}
};

// Endless batches from a loader, epoch after epoch.
class Feed {
 public:
  Feed(const dkit::Dataset& data, const dkit::LoaderOptions& options) : loader_(data, dkit::cpu(), options) {
    loader_.start_epoch(epoch_);
  }

  dkit::Batch next() {
    auto batch = loader_.next();
    if (!batch) {
      loader_.start_epoch(++epoch_);
      batch = loader_.next();
    }
    return std::move(*batch);
  }

 private:
  dkit::Loader loader_;
  int64_t epoch_ = 0;
};

struct Step {
  dkit::Mlp net;
  torch::optim::Adam optimizer;
  dkit::MetricBuffer metrics;

  explicit Step(int64_t features)
      : net(dkit::MlpOptions(features, {256, 256}, 10)),
        optimizer(net->parameters(), torch::optim::AdamOptions(1e-3)),
        metrics({"loss", "correct"}, dkit::cpu(), 100) {}

  void run(const at::Tensor& x, const at::Tensor& y, bool record) {
    optimizer.zero_grad();
    const auto logits = net->forward(x);
    const auto loss = torch::nn::functional::cross_entropy(logits, y);
    loss.backward();
    optimizer.step();
    if (record) {
      metrics.add({loss.detach(), logits.argmax(1).eq(y).sum()});
      if (metrics.full()) {
        metrics.flush();
      }
    }
  }
};

Work loader_alone(const dkit::Dataset& data, const dkit::LoaderOptions& options) {
  auto feed = std::make_shared<Feed>(data, options);
  return [feed](int64_t count) {
    int64_t samples = 0;
    const auto start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      samples += feed->next().size();
    }
    const auto elapsed = Clock::now() - start;
    TORCH_INTERNAL_ASSERT(samples > 0, "no samples");
    return elapsed;
  };
}

Work fixed_batch_steps(const dkit::Dataset& data, bool record) {
  auto step = std::make_shared<Step>(data.num_features());
  const auto x = data.features.narrow(0, 0, 64).clone();
  const auto y = data.labels.narrow(0, 0, 64).clone();
  return [step, x, y, record](int64_t count) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      step->run(x, y, record);
    }
    return Clock::now() - start;
  };
}

Work loader_steps(const dkit::Dataset& data, const dkit::LoaderOptions& options,
                  std::shared_ptr<Clock::duration> in_next) {
  auto step = std::make_shared<Step>(data.num_features());
  auto feed = std::make_shared<Feed>(data, options);
  return [step, feed, in_next](int64_t count) {
    *in_next = Clock::duration::zero();
    const auto start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      const auto before = Clock::now();
      const dkit::Batch batch = feed->next();
      *in_next += Clock::now() - before;
      step->run(batch.features, batch.labels, /*record=*/true);
    }
    return Clock::now() - start;
  };
}

Work metric_adds() {
  auto metrics = std::make_shared<dkit::MetricBuffer>(std::vector<std::string>{"loss", "correct"}, dkit::cpu(), 100);
  const auto loss = torch::tensor(0.5f);
  const auto correct = torch::tensor(int64_t{60});
  return [metrics, loss, correct](int64_t count) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      metrics->add({loss, correct});
      if (metrics->full()) {
        metrics->flush();
      }
    }
    return Clock::now() - start;
  };
}

void measure(std::vector<Case>& cases, int64_t count, int64_t rounds) {
  for (auto& c : cases) {
    c.work(count / 5 + 1);  // warm-up
  }
  for (int64_t r = 0; r < rounds; ++r) {
    for (auto& c : cases) {
      c.micros.push_back(std::chrono::duration<double, std::micro>(c.work(count)).count() /
                         static_cast<double>(count));
      c.next_micros.push_back(std::chrono::duration<double, std::micro>(*c.in_next).count() /
                              static_cast<double>(count));
    }
  }
}

void print(const std::vector<Case>& cases, const Case* baseline) {
  double base = 0;
  if (baseline != nullptr) {
    auto sorted = baseline->micros;
    std::sort(sorted.begin(), sorted.end());
    base = sorted[sorted.size() / 2];
  }
  for (const auto& c : cases) {
    auto sorted = c.micros;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::printf("  %-34s median %9.2f  best %9.2f", c.name.c_str(), median, sorted.front());
    auto in_next = c.next_micros;
    std::sort(in_next.begin(), in_next.end());
    if (!in_next.empty() && in_next.back() > 0) {
      std::printf("  in next(): median %6.2f best %6.2f", in_next[in_next.size() / 2], in_next.front());
    }
    if (baseline != nullptr && &c != baseline) {
      std::printf("  (median %+8.2f vs %s)", median - base, baseline->name.c_str());
    }
    std::printf("\n");
  }
}

} // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "data/digits.csv";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 500;
  const int64_t rounds = argc > 3 ? std::stoll(argv[3]) : 7;
  const int threads = argc > 4 ? std::stoi(argv[4]) : 2;
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const auto read_start = Clock::now();
  const dkit::Dataset raw = dkit::read_csv(path);
  const double read_ms = std::chrono::duration<double, std::milli>(Clock::now() - read_start).count();
  const dkit::Dataset data = dkit::fit_normalization(raw.features, dkit::Scaling::kStandardize).apply(raw);
  std::printf("%s (read in %.1f ms); batch 64, %d threads, LibTorch %s; %lld rounds of %lld\n",
              data.description.c_str(), read_ms, threads, TORCH_VERSION, static_cast<long long>(rounds),
              static_cast<long long>(steps));

  const auto base = dkit::LoaderOptions(64).seed(1);
  const auto pinned = dkit::LoaderOptions(base).placement(dkit::Placement::kPinned);
  std::vector<Case> alone;
  alone.emplace_back("device, shuffled", loader_alone(data, base));
  alone.emplace_back("device, unshuffled", loader_alone(data, dkit::LoaderOptions(base).shuffle(false)));
  alone.emplace_back("pageable", loader_alone(data, dkit::LoaderOptions(base).placement(dkit::Placement::kPageable)));
  alone.emplace_back("pinned (CPU fallback), prefetch 2", loader_alone(data, dkit::LoaderOptions(pinned).prefetch(2)));
  alone.emplace_back("pinned (CPU fallback), prefetch 4", loader_alone(data, dkit::LoaderOptions(pinned).prefetch(4)));
  alone.emplace_back("MetricBuffer::add, 2 values", metric_adds());
  measure(alone, steps * 20, rounds);
  std::printf("\nLoader::next() alone, and MetricBuffer::add (us per call):\n");
  print(alone, nullptr);

  std::vector<Case> training;
  training.emplace_back("fixed batch, no metrics", fixed_batch_steps(data, false));
  training.emplace_back("fixed batch + metrics", fixed_batch_steps(data, true));
  const std::vector<std::pair<std::string, dkit::LoaderOptions>> loaders = {
      {"loader device + metrics", base},
      {"loader pageable + metrics", dkit::LoaderOptions(base).placement(dkit::Placement::kPageable)},
      {"loader pinned (CPU) + metrics", pinned}};
  for (const auto& [name, options] : loaders) {
    Case c(name, nullptr);
    c.work = loader_steps(data, options, c.in_next);
    training.push_back(std::move(c));
  }
  measure(training, steps, rounds);
  std::printf("\nMLP [%lld, 256, 256, 10] + Adam training step (us per step):\n",
              static_cast<long long>(data.num_features()));
  print(training, &training[0]);
  return 0;
}
