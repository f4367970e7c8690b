// Runs the ONNX backend test suite (Debian's libonnx-testdata) through InferenceSession.
// Usage: run_backend DATA_ROOT EXPECTED_PASS_FILE [--write-expected FILE] [--filter SUBSTRING] [--verbose]
// Prints "ONNX backend: P passed, F failed, U unsupported" and fails if a test listed in
// EXPECTED_PASS_FILE does not pass; exits 2 without running any test if that file is missing,
// names no test, or names a test that DATA_ROOT does not have.

#include "onnx_import/onnx_import.hpp"
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace popart;

namespace {

enum class Outcome { Pass, Fail, Unsupported };

bool isUnsupportedMessage(const std::string &m) {
  for (const char *k : {"unsupported op", "not supported", "no CPU kernel", "is not a tensor", "control flow",
                        "must be known before running"})
    if (m.find(k) != std::string::npos) return true;
  return false;
}

bool closeEnough(double w, double g) {
  if (std::isnan(w) && std::isnan(g)) return true;
  if (std::isinf(w) && w == g) return true;
  return std::fabs(g - w) <= 1e-7 + 1e-3 * std::fabs(w);
}

/// Compares a sequence or optional output with the expected SequenceProto / OptionalProto file.
bool sameSequence(const fs::path &file, ValueKind kind, const SequenceOutput &got, std::string &detail) {
  SequenceData want = onnx_import::readSequenceProtoFile(file.string(), kind);
  if (want.present != got.present || want.items.size() != got.infos.size()) {
    detail = "expected " + std::to_string(want.items.size()) + " elements" + (want.present ? "" : " (no value)") +
             ", got " + std::to_string(got.infos.size()) + (got.present ? "" : " (no value)");
    return false;
  }
  for (size_t e = 0; e < want.items.size(); ++e) {
    if (want.items[e].info() != got.infos[e]) {
      detail = "element " + std::to_string(e) + ": expected " + want.items[e].info().toString() + ", got " +
               got.infos[e].toString();
      return false;
    }
    TensorData g(got.infos[e], got.bytes[e].data());
    for (int64_t k = 0; k < g.info().elementCount(); ++k)
      if (!closeEnough(want.items[e].valueAsDouble(k), g.valueAsDouble(k))) {
        detail = "element " + std::to_string(e) + "[" + std::to_string(k) + "] differs";
        return false;
      }
  }
  return true;
}

Outcome runTest(const fs::path &dir, std::string &detail) {
  try {
    SessionOptions so;
    so.numThreads = 1;
    so.verifyIr = true; // the IR verifier after every pass of the pipeline
    auto probe =
        InferenceSession::createFromOnnxModel((dir / "model.onnx").string(), DataFlow(1, std::vector<TensorId>{}), so);
    auto outputsIds = probe->getOutputIds();
    auto session = InferenceSession::createFromOnnxModel((dir / "model.onnx").string(), DataFlow(1, outputsIds), so);
    std::vector<fs::path> sets;
    for (const auto &e : fs::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
    std::sort(sets.begin(), sets.end());
    for (const auto &set : sets) {
      auto inputIds = session->getInputIds();
      std::vector<TensorData> inputs;
      std::map<TensorId, SequenceData> sequences; // sequence and optional inputs
      for (size_t i = 0; i < inputIds.size(); ++i) {
        std::string file = (set / ("input_" + std::to_string(i) + ".pb")).string();
        ValueKind kind = session->getInfo(inputIds[i]).valueKind();
        if (kind == ValueKind::Tensor) {
          inputs.push_back(onnx_import::readTensorProtoFile(file));
        } else {
          inputs.emplace_back();
          sequences[inputIds[i]] = onnx_import::readSequenceProtoFile(file, kind);
        }
      }
      std::vector<std::unique_ptr<RawArray>> arrays;
      std::map<TensorId, IArray &> in, out;
      std::map<TensorId, SequenceInput> sequenceInputs;
      for (auto &[id, value] : sequences) {
        SequenceInput si;
        si.present = value.present;
        for (TensorData &t : value.items) {
          arrays.push_back(std::make_unique<RawArray>(t.data(), t.info().dataType(), t.info().shape()));
          si.elements.push_back(arrays.back().get());
        }
        sequenceInputs[id] = si;
      }
      for (size_t i = 0; i < inputIds.size(); ++i) {
        if (sequences.count(inputIds[i])) continue;
        // ONNX 1.12's test data stores bfloat16 tensors as UINT16.
        if (inputs[i].info().dataType() == DataType::UINT16 &&
            session->getInfo(inputIds[i]).dataType() == DataType::BFLOAT16)
          inputs[i].reinterpretAs(DataType::BFLOAT16);
        void *data = inputs[i].info().dataType() == DataType::STRING ? static_cast<void *>(inputs[i].strings().data())
                                                                     : inputs[i].data();
        arrays.push_back(std::make_unique<RawArray>(data, inputs[i].info().dataType(), inputs[i].info().shape()));
        in.emplace(inputIds[i], *arrays.back());
      }
      StepIO compileOnly(in, {});
      for (const auto &[id, si] : sequenceInputs)
        compileOnly.setSequenceInput(id, si);
      session->run(compileOnly);
      std::vector<TensorData> got;
      std::vector<TensorInfo> outInfos;
      for (const auto &id : outputsIds) {
        outInfos.push_back(session->getInfo(id));
        got.emplace_back(outInfos.back().isTensor() ? TensorData(outInfos.back()) : TensorData());
      }
      for (size_t i = 0; i < outputsIds.size(); ++i) {
        if (!outInfos[i].isTensor()) continue; // read with getSequenceOutput
        void *data =
            got[i].info().dataType() == DataType::STRING ? static_cast<void *>(got[i].strings().data()) : got[i].data();
        arrays.push_back(std::make_unique<RawArray>(data, got[i].info().dataType(), got[i].info().shape()));
        out.emplace(outputsIds[i], *arrays.back());
      }
      StepIO io(in, out);
      for (const auto &[id, si] : sequenceInputs)
        io.setSequenceInput(id, si);
      session->run(io);
      for (size_t i = 0; i < outputsIds.size(); ++i) {
        fs::path p = set / ("output_" + std::to_string(i) + ".pb");
        if (!fs::exists(p)) continue;
        if (!outInfos[i].isTensor()) {
          if (!sameSequence(p, outInfos[i].valueKind(), session->getSequenceOutput(outputsIds[i]), detail)) {
            detail = "output " + outputsIds[i] + ": " + detail;
            return Outcome::Fail;
          }
          continue;
        }
        TensorData want = onnx_import::readTensorProtoFile(p.string());
        if (want.info().dataType() == DataType::UINT16 && got[i].info().dataType() == DataType::BFLOAT16)
          want.reinterpretAs(DataType::BFLOAT16);
        if (want.info() != got[i].info()) {
          detail =
              "output " + outputsIds[i] + ": expected " + want.info().toString() + ", got " + got[i].info().toString();
          return Outcome::Fail;
        }
        if (want.info().dataType() == DataType::STRING) {
          if (want.strings() != got[i].strings()) {
            detail = "output " + outputsIds[i] + ": strings differ";
            return Outcome::Fail;
          }
          continue;
        }
        for (int64_t k = 0; k < want.info().elementCount(); ++k) {
          double w = want.valueAsDouble(k), g = got[i].valueAsDouble(k);
          if (std::isnan(w) && std::isnan(g)) continue;
          if (std::isinf(w) && w == g) continue;
          if (!(std::fabs(g - w) <= 1e-7 + 1e-3 * std::fabs(w))) {
            detail = "output " + outputsIds[i] + "[" + std::to_string(k) + "]: expected " + std::to_string(w) +
                     ", got " + std::to_string(g);
            return Outcome::Fail;
          }
        }
      }
    }
    return Outcome::Pass;
  } catch (const std::exception &e) {
    detail = e.what();
    return isUnsupportedMessage(detail) ? Outcome::Unsupported : Outcome::Fail;
  }
}

/// Runs one test in a child process so that a crash or a hang fails that test only.
Outcome runIsolated(const fs::path &dir, std::string &detail, int timeoutSeconds) {
  int fds[2];
  if (pipe(fds) != 0) return runTest(dir, detail);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string d;
    Outcome o = runTest(dir, d);
    std::string msg = std::to_string(static_cast<int>(o)) + d;
    ssize_t written = write(fds[1], msg.data(), msg.size());
    (void)written;
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  pollfd pfd{fds[0], POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);
  bool timedOut = false;
  while (true) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) {
      timedOut = true;
      break;
    }
    if (poll(&pfd, 1, left) <= 0) continue;
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timedOut) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timedOut) {
    detail = "timed out after " + std::to_string(timeoutSeconds) + " s";
    return Outcome::Fail;
  }
  if (msg.empty()) {
    detail = WIFSIGNALED(status) ? "crashed with signal " + std::to_string(WTERMSIG(status))
                                 : "child exited without a result";
    return Outcome::Fail;
  }
  detail = msg.substr(1);
  return static_cast<Outcome>(msg[0] - '0');
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::cerr << "usage: run_backend DATA_ROOT EXPECTED_PASS_FILE [--write-expected FILE] [--filter S] [--verbose]\n";
    return 2;
  }
  fs::path root = argv[1];
  std::string expectedFile = argv[2], writeExpected, filter;
  bool verbose = false;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--write-expected" && i + 1 < argc)
      writeExpected = argv[++i];
    else if (a == "--filter" && i + 1 < argc)
      filter = argv[++i];
    else if (a == "--verbose")
      verbose = true;
  }
  // A missing or empty list would check nothing and pass.
  std::set<std::string> expected;
  {
    std::ifstream in(expectedFile);
    if (!in) {
      std::cerr << "cannot read the expected-pass list " << expectedFile << "\n";
      return 2;
    }
    std::string line;
    while (std::getline(in, line))
      if (!line.empty() && line[0] != '#') expected.insert(line);
  }
  if (expected.empty()) {
    std::cerr << "the expected-pass list " << expectedFile << " names no test\n";
    return 2;
  }
  std::vector<std::string> names;
  for (const char *group : {"node", "simple", "pytorch-converted", "pytorch-operator"}) {
    if (!fs::is_directory(root / group)) {
      std::cerr << "missing test folder " << (root / group).string() << " (install libonnx-testdata)\n";
      return 2;
    }
    for (const auto &e : fs::directory_iterator(root / group))
      if (e.is_directory()) names.push_back(std::string(group) + "/" + e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  // A name that matches no test (a typo, a test removed from the data) would never be checked.
  std::vector<std::string> unknown;
  for (const auto &e : expected)
    if (!std::binary_search(names.begin(), names.end(), e)) unknown.push_back(e);
  if (!unknown.empty()) {
    std::cerr << expectedFile << " names " << unknown.size() << " test(s) that " << root.string()
              << " does not have:\n";
    for (const auto &u : unknown)
      std::cerr << "  " << u << "\n";
    return 2;
  }
  int passed = 0, failed = 0, unsupported = 0;
  std::vector<std::string> regressions, passing;
  for (const auto &name : names) {
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    std::string detail;
    Outcome o = runIsolated(root / name, detail, 120);
    std::replace(detail.begin(), detail.end(), '\n', ' ');
    if (detail.size() > 300) detail = detail.substr(0, 300) + "...";
    switch (o) {
    case Outcome::Pass:
      ++passed;
      passing.push_back(name);
      break;
    case Outcome::Fail: ++failed; break;
    case Outcome::Unsupported: ++unsupported; break;
    }
    if (o != Outcome::Pass && expected.count(name)) regressions.push_back(name + ": " + detail);
    if (verbose)
      std::cout << (o == Outcome::Pass   ? "PASS "
                    : o == Outcome::Fail ? "FAIL "
                                         : "UNSUPPORTED ")
                << name << (detail.empty() ? "" : "  -- " + detail) << "\n";
  }
  std::cout << "ONNX backend: " << passed << " passed, " << failed << " failed, " << unsupported << " unsupported\n";
  if (!writeExpected.empty()) {
    std::ofstream out(writeExpected);
    out << "# ONNX backend tests that pass; regenerate with run_backend --write-expected after a fix.\n";
    for (const auto &n : passing)
      out << n << "\n";
  }
  for (const auto &r : regressions)
    std::cout << "REGRESSION " << r << "\n";
  return regressions.empty() ? 0 : 1;
}
