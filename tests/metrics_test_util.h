// tests/metrics_test_util.h: reading Prometheus text in tests, and promtool.
//
//   std::vector<Sample> samples = ParsePrometheusText(text);
//   const Sample* s = FindSample(samples, "devmem_allocated_bytes",
//                                {{"device", "sim:0"}, {"pool", "small"}});
//   EXPECT_EQ(PromtoolCheck(text), "");   // "" when `promtool check metrics` is clean
//
// The parser understands what prometheus-cpp's TextSerializer writes (one sample a
// line, `name{k="v",...} value`, escapes \\ \" \n in label values); it is not a
// general exposition-format parser.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace devmem::testutil {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

inline std::vector<Sample> ParsePrometheusText(std::string_view text) {
  std::vector<Sample> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        std::string key(line.substr(i, eq - i));
        i = eq + 2;  // skip ="
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value.push_back(line[i] == 'n' ? '\n' : line[i]);
          } else {
            value.push_back(line[i]);
          }
          ++i;
        }
        ++i;  // closing quote
        if (i < line.size() && line[i] == ',') ++i;
        s.labels[key] = value;
      }
      ++i;  // '}'
    }
    std::string value(line.substr(i + 1));
    if (size_t sp = value.find(' '); sp != std::string::npos) value.resize(sp);  // timestamp
    s.value = value == "+Inf" ? 1.0 / 0.0 : std::strtod(value.c_str(), nullptr);
    out.push_back(std::move(s));
  }
  return out;
}

// The sample `name` whose labels include every pair of `labels`; nullptr if none.
inline const Sample* FindSample(const std::vector<Sample>& samples, std::string_view name,
                                const std::map<std::string, std::string>& labels) {
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) return &s;
  }
  return nullptr;
}

// The value of FindSample, or -1 (and a test failure) when there is none.
inline double SampleValue(const std::vector<Sample>& samples, std::string_view name,
                          const std::map<std::string, std::string>& labels) {
  const Sample* s = FindSample(samples, name, labels);
  EXPECT_NE(s, nullptr) << "no sample " << name << " with the given labels";
  return s == nullptr ? -1 : s->value;
}

// Every sample of `name`.
inline std::vector<Sample> SamplesOf(const std::vector<Sample>& samples,
                                     std::string_view name) {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (s.name == name) out.push_back(s);
  }
  return out;
}

// Runs `promtool check metrics` on `text`. Returns "" when it is clean, otherwise what
// promtool said (and its exit status). promtool is a real dependency of the tests
// (Debian package `prometheus`, installed by scripts/setup.sh): a missing promtool is
// reported as a failure, not skipped.
inline std::string PromtoolCheck(const std::string& text) {
  const char* const kPromtool = "/usr/bin/promtool";
  std::string promtool = kPromtool;
  if (access(kPromtool, X_OK) != 0) {
    if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
      return "promtool not found: install Debian's `prometheus` package "
             "(scripts/setup.sh does) to check the metrics text";
    }
    promtool = "promtool";
  }
  char path[] = "/tmp/devmem_metrics_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "cannot create a temporary file";
  close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }
  const std::string command = promtool + " check metrics < " + path + " 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "cannot run " + command;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  unlink(path);
  if (status == 0 && output.empty()) return "";
  return "promtool check metrics (status " + std::to_string(status) + "): " + output;
}

}  // namespace devmem::testutil
