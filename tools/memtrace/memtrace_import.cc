// tools/memtrace/memtrace_import.cc: `memtrace import --from rmm-csv|pytorch-snapshot|umpire FILE
// -o TRACE.jsonl`: converts another allocator's log into a devmem trace that `memtrace
// replay` and `memtrace timeline` read. RMM and Umpire logs are converted here
// (tools/import/trace_import.h says which fields are read); PyTorch snapshots are pickles,
// converted by tools/import/import_pytorch_snapshot.py (Python's standard library), which this
// command runs with python3 (found beside the memtrace executable, else in the source
// tree; DEVMEM_IMPORT_PYTORCH overrides the path).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/import/trace_import.h"

#ifndef DEVMEM_SOURCE_IMPORT_DIR
#define DEVMEM_SOURCE_IMPORT_DIR "tools/import"
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
  return std::string(DEVMEM_SOURCE_IMPORT_DIR) + "/" + kScript;
}

int RunPytorch(const std::string& input, const std::string& output, bool json) {
  const std::string script = PytorchScript();
  // Options first, then "--": argparse would take an input named "--help" (or an output
  // starting with '-') for an option. The script writes "-" to stdout and its --json
  // summary as ours (below).
  std::vector<std::string> args = {"python3", script, "--output=" + output};
  if (json) args.push_back("--json");
  args.push_back("--");
  args.push_back(input);
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

// The input, read-only: mapped when it is a regular file (no copy on the heap: the
// importers read it as a view), read into memory otherwise (a pipe).
class InputText {
 public:
  ~InputText() {
    if (map_ != nullptr) munmap(map_, size_);
  }
  // False with errno set when the file cannot be opened or read.
  bool Open(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st {};
    bool ok = fstat(fd, &st) == 0;
    if (ok && S_ISREG(st.st_mode) && st.st_size > 0) {
      size_ = static_cast<size_t>(st.st_size);
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      ok = p != MAP_FAILED;
      if (ok) map_ = static_cast<char*>(p);
    } else if (ok) {
      char buf[1 << 16];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) != 0;) {
        if (n < 0) {
          if (errno == EINTR) continue;
          ok = false;
          break;
        }
        copy_.append(buf, static_cast<size_t>(n));
      }
    }
    const int saved = errno;
    close(fd);
    errno = saved;
    return ok;
  }
  std::string_view text() const {
    return map_ != nullptr ? std::string_view(map_, size_) : std::string_view(copy_);
  }

 private:
  char* map_ = nullptr;
  size_t size_ = 0;
  std::string copy_;
};

// The summary of a conversion: one JSON object (--json) or one line, on stdout, or on
// stderr when the trace itself goes to stdout (-o -).
void Report(const std::string& from, const std::string& input, const std::string& output,
            const ImportStats& stats, bool json) {
  std::FILE* report = output == "-" ? stderr : stdout;
  if (json) {
    nlohmann::ordered_json j{{"from", from},
                             {"input", input},
                             {"output", output},
                             {"allocs", stats.allocs},
                             {"frees", stats.frees + stats.unmatched_frees},
                             {"unmatched_frees", stats.unmatched_frees},
                             {"ooms", stats.ooms},
                             {"skipped_lines", stats.skipped}};
    std::fprintf(report, "%s\n", j.dump().c_str());
    return;
  }
  std::fprintf(report,
               "memtrace import: %s: %llu allocations, %llu frees (%llu of pointers not "
               "allocated in the log), %llu OOMs, %llu other lines skipped -> %s\n",
               input.c_str(), static_cast<unsigned long long>(stats.allocs),
               static_cast<unsigned long long>(stats.frees + stats.unmatched_frees),
               static_cast<unsigned long long>(stats.unmatched_frees),
               static_cast<unsigned long long>(stats.ooms),
               static_cast<unsigned long long>(stats.skipped), output.c_str());
}

int RunImport(const std::string& from, const std::string& input, const std::string& output,
              bool json) {
  if (from == "pytorch-snapshot") return RunPytorch(input, output, json);
  InputText in;
  if (!in.Open(input)) {
    std::fprintf(stderr, "memtrace import: %s: cannot read (%s)\n", input.c_str(),
                 std::strerror(errno));
    return kExitBadInput;
  }
  auto convert = [&](std::FILE* file) -> absl::StatusOr<ImportStats> {
    std::string buffer;
    try {
      return from == "rmm-csv" ? ImportRmmCsv(in.text(), input, &buffer, file)
                               : ImportUmpire(in.text(), input, &buffer, file);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(input + ": not enough memory to convert it");
    }
  };
  if (output == "-") {
    // Streamed as it is made: a failed import has written part of a trace to stdout,
    // which the exit status (2) and the message say.
    absl::StatusOr<ImportStats> stats = convert(stdout);
    if (stats.ok() && std::fflush(stdout) != 0) {
      stats = absl::DataLossError("-o -: cannot write to stdout");
    }
    if (!stats.ok()) {
      std::fprintf(stderr, "memtrace import: %s\n", std::string(stats.status().message()).c_str());
      return kExitBadInput;
    }
    Report(from, input, output, *stats, json);
    return kExitOk;
  }
  // Written as it is made into a temporary file beside the output, renamed at the end:
  // memory stays at the input's mapping plus ~1 MiB, and a failed import leaves no
  // partial trace (and the old output, if any, untouched).
  const std::string tmp = output + ".tmp-" + std::to_string(getpid());
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    std::fprintf(stderr, "memtrace import: %s: cannot write (%s)\n", output.c_str(),
                 std::strerror(errno));
    return kExitBadInput;
  }
  absl::StatusOr<ImportStats> stats = convert(file);
  const bool closed = std::fclose(file) == 0;
  if (!stats.ok() || !closed || std::rename(tmp.c_str(), output.c_str()) != 0) {
    const int saved = errno;
    std::remove(tmp.c_str());
    if (!stats.ok()) {
      std::fprintf(stderr, "memtrace import: %s\n", std::string(stats.status().message()).c_str());
    } else {
      std::fprintf(stderr, "memtrace import: %s: cannot write (%s)\n", output.c_str(),
                   std::strerror(saved));
    }
    return kExitBadInput;
  }
  Report(from, input, output, *stats, json);
  return kExitOk;
}

}  // namespace

void AddImportCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string from, input, output;
    bool json = false;
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
  cmd->add_option("-o,--output", opts->output,
                  "the devmem trace to write (JSON Lines; - for stdout, the summary then "
                  "going to stderr)")
      ->required();
  cmd->add_flag("--json", opts->json, "print the summary as one JSON object");
  cmd->callback([opts, exit_code] {
    *exit_code = RunImport(opts->from, opts->input, opts->output, opts->json);
  });
}

}  // namespace devmem::memtrace
