// SummaryWriter's purge_step (io/tensorboard.h): the events torch.utils.tensorboard
// writes for it (a file_version event and a SessionLog START, both at the purge step),
// read back by our reader; and, when Python's tensorboard package is importable, its
// EventAccumulator showing a killed run's steps >= purge_step replaced by the resumed
// run's (SKIPPED otherwise).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness.h"

using namespace nd;
using namespace nd::tensorboard;
using nd::testing::error_message;
namespace fs = std::filesystem;

namespace {

// A fresh folder for one test case, removed when it ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("nanoddp_purge_step_test_" + std::to_string(getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

SummaryWriterOptions purge_at(int64_t step) {
  SummaryWriterOptions o;
  o.purge_step = step;
  return o;
}

}  // namespace

TEST_CASE("tensorboard purge_step: the file starts with file_version and SessionLog START at the purge step") {
  const TempDir dir("events");
  std::string path;
  {
    SummaryWriter w(dir.path.string(), purge_at(5));
    path = w.file_path();
    CHECK(read_events(path).size() == 3);  // written at once, before any add_*
    w.add_scalar("loss", 0.25, 5);
  }
  const std::vector<Event> events = read_events(path);
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[1].step == 5);
  CHECK(events[1].file_version == "brain.Event:2");
  CHECK_FALSE(events[1].session_log);
  CHECK(events[2].step == 5);
  CHECK(events[2].file_version.empty());
  REQUIRE(events[2].session_log);
  CHECK(events[2].session_log->status == SessionLog::START);
  CHECK_FALSE(events[2].summary);
  REQUIRE(events[3].summary);
  CHECK(events[3].summary->value.at(0).tag == "loss");

  // Without purge_step: no such events (as PyTorch).
  SummaryWriter plain((dir.path / "plain").string());
  plain.flush();
  CHECK(read_events(plain.file_path()).size() == 1);
}

TEST_CASE("tensorboard purge_step: SessionLog round-trips every status and a negative step is an error") {
  for (int status : {SessionLog::STATUS_UNSPECIFIED, SessionLog::START, SessionLog::STOP, SessionLog::CHECKPOINT}) {
    Event e;
    e.step = 7;
    e.session_log = SessionLog{status};
    const Event back = parse_event(serialize(e));
    REQUIRE(back.session_log);
    CHECK(back.session_log->status == status);
    CHECK(back.step == 7);
  }
  const TempDir dir("negative");
  CHECK(error_message([&] { SummaryWriter w(dir.path.string(), purge_at(-1)); }) ==
        "SummaryWriter: expected purge_step >= 0, got -1");
  CHECK(std::filesystem::is_empty(dir.path));  // checked before the event file is created
}

TEST_CASE("tensorboard purge_step: Python's EventAccumulator hides the killed run's steps >= purge_step") {
  if (std::system("python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: Python's tensorboard package is not installed (pip install tensorboard)");
    return;
  }
  const TempDir dir("python");
  {  // a run that logged steps 0..9 and was killed after its checkpoint at step 4
    SummaryWriter killed(dir.path.string());
    for (int s = 0; s < 10; ++s) killed.add_scalar("loss", 100 + s, s);
  }
  {  // resumed from the checkpoint: its first step is 5
    SummaryWriter resumed(dir.path.string(), purge_at(5));
    for (int s = 5; s < 8; ++s) resumed.add_scalar("loss", 200 + s, s);
  }
  const fs::path script = dir.path / "read.py";
  std::ofstream(script) << R"(import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(" ".join("%d:%g" % (e.step, e.value) for e in acc.Scalars("loss")))
)";
  // stdout holds the steps; stderr TensorBoard's own log line about the purge.
  const fs::path out = dir.path / "read.txt", err = dir.path / "read.err";
  const int rc = std::system(("python3 " + script.string() + " " + dir.path.string() + " > " + out.string() + " 2> " +
                              err.string()).c_str());
  auto slurp = [](const fs::path& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string text = slurp(out);
  INFO(text);
  INFO(slurp(err));
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  CHECK(text == "0:100 1:101 2:102 3:103 4:104 5:205 6:206 7:207\n");
}
