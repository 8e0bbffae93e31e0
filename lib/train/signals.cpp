#include <dkit/train/trainer.h>

#include <unistd.h>

#include <csignal>

namespace dkit {
namespace {

std::shared_ptr<StopRequest> g_stop;

void on_stop_signal(int signal) {
  if (g_stop->reason() != 0) {
    _exit(128 + signal);
  }
  g_stop->request(signal);
}

} // namespace

std::shared_ptr<StopRequest> stop_on_signals() {
  if (!g_stop) {
    g_stop = std::make_shared<StopRequest>();
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
  }
  return g_stop;
}

} // namespace dkit
