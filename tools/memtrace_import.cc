// tools/memtrace_import.cc: `memtrace import --from rmm-csv|pytorch-snapshot|umpire FILE
// -o TRACE.jsonl`: converts another allocator's log into a devmem trace that `memtrace
// replay` and `memtrace timeline` read. RMM and Umpire logs are converted here
// (tools/trace_import.h says which fields are read); PyTorch snapshots are pickles,
// converted by tools/import_pytorch_snapshot.py (Python's standard library), which this
// command runs with python3 (found beside the memtrace executable, else in the source
// tree; DEVMEM_IMPORT_PYTORCH overrides the path).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tools/memtrace_commands.h"
#include "tools/trace_import.h"

#ifndef DEVMEM_SOURCE_TOOLS_DIR
#define DEVMEM_SOURCE_TOOLS_DIR "tools"
#endif

namespace devmem::memtrace {
namespace {

constexpr char kScript[] = "import_pytorch_snapshot.py";

std::string PytorchScript() {
  if (const char* env = std::getenv("DEVMEM_IMPORT_PYTORCH"); env != nullptr && *env) {
    return env;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    if (access((dir + kScript).c_str(), R_OK) == 0) return dir + kScript;
  }
  return std::string(DEVMEM_SOURCE_TOOLS_DIR) + "/" + kScript;
}

int RunPytorch(const std::string& input, const std::string& output) {
  const std::string script = PytorchScript();
  std::vector<std::string> args = {"python3", script, input, "-o", output};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "memtrace import: fork: %s\n", std::strerror(errno));
    return kExitBadInput;
  }
  if (pid == 0) {
    execvp("python3", argv.data());
    std::fprintf(stderr, "memtrace import: cannot run python3 %s: %s\n", script.c_str(),
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return kExitOk;
  // The script has printed what was wrong (file and entry); its statuses are ours.
  return kExitBadInput;
}

int RunImport(const std::string& from, const std::string& input, const std::string& output) {
  if (from == "pytorch-snapshot") return RunPytorch(input, output);
  std::ifstream in(input, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "memtrace import: %s: cannot read (%s)\n", input.c_str(),
                 std::strerror(errno));
    return kExitBadInput;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::string out;
  absl::StatusOr<ImportStats> stats = from == "rmm-csv" ? ImportRmmCsv(text, input, &out)
                                                        : ImportUmpire(text, input, &out);
  if (!stats.ok()) {
    std::fprintf(stderr, "memtrace import: %s\n", std::string(stats.status().message()).c_str());
    return kExitBadInput;
  }
  std::ofstream file(output, std::ios::binary | std::ios::trunc);
  file << out;
  file.flush();
  if (!file) {
    std::fprintf(stderr, "memtrace import: %s: cannot write\n", output.c_str());
    return kExitBadInput;
  }
  std::fprintf(stderr,
               "memtrace import: %s: %llu allocations, %llu frees (%llu of pointers not "
               "allocated in the log), %llu OOMs, %llu other lines skipped -> %s\n",
               input.c_str(), static_cast<unsigned long long>(stats->allocs),
               static_cast<unsigned long long>(stats->frees + stats->unmatched_frees),
               static_cast<unsigned long long>(stats->unmatched_frees),
               static_cast<unsigned long long>(stats->ooms),
               static_cast<unsigned long long>(stats->skipped), output.c_str());
  return kExitOk;
}

}  // namespace

void AddImportCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string from, input, output;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "import", "Convert an RMM, Umpire or PyTorch allocation log into a devmem trace");
  cmd->add_option("--from", opts->from, "the log's format")
      ->required()
      ->check(CLI::IsMember({"rmm-csv", "pytorch-snapshot", "umpire"}));
  cmd->add_option("file", opts->input,
                  "RMM logging_resource_adaptor CSV, Umpire replay log (JSON lines) or "
                  "torch.cuda.memory._dump_snapshot pickle")
      ->required();
  cmd->add_option("-o,--output", opts->output, "the devmem trace to write (JSON Lines)")
      ->required();
  cmd->callback([opts, exit_code] {
    *exit_code = RunImport(opts->from, opts->input, opts->output);
  });
}

}  // namespace devmem::memtrace
