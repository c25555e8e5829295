// NVRTC compilation to CUBIN: every NVRTC call checked, the program freed on every path,
// and a compile error reported with the log and the numbered source.
#include "gpu/nvrtc_compiler.h"

#include <nvrtc.h>

#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/log.h"

namespace kiln::gpu {
namespace {

[[noreturn]] void throw_nvrtc_error(nvrtcResult result, const char* call, const char* file,
                                    int line) {
  throw Error(fmt::format("NVRTC error {} ({}) in `{}` at {}:{}", static_cast<int>(result),
                          nvrtcGetErrorString(result), call, file, line));
}

// Turns a failed NVRTC call into a kiln::Error naming the call.
#define KILN_NVRTC_CHECK(expr)                                          \
  do {                                                                  \
    const nvrtcResult kiln_nvrtc_result_ = (expr);                      \
    if (kiln_nvrtc_result_ != NVRTC_SUCCESS)                            \
      throw_nvrtc_error(kiln_nvrtc_result_, #expr, __FILE__, __LINE__); \
  } while (0)

// Owns an nvrtcProgram; destroying it cannot fail in a way the caller could act on.
class Program {
 public:
  explicit Program(const KernelSource& src) {
    const std::string file_name = src.name + ".cu";
    KILN_NVRTC_CHECK(
        nvrtcCreateProgram(&program_, src.code.c_str(), file_name.c_str(), 0, nullptr, nullptr));
  }
  ~Program() {
    if (program_ != nullptr && nvrtcDestroyProgram(&program_) != NVRTC_SUCCESS)
      log().warn("nvrtcDestroyProgram failed");
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return program_; }

 private:
  nvrtcProgram program_ = nullptr;
};

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

std::vector<std::string> nvrtc_options(const KernelSource& src, const JitTarget& target) {
  bool has_std = false;
  for (const std::string& option : src.options) {
    KILN_CHECK(!starts_with(option, "--gpu-architecture") && !starts_with(option, "-arch"),
               "kernel '{}': option '{}' is not allowed; the architecture comes from the JitTarget "
               "(sm_{})",
               src.name, option, target.sm);
    has_std = has_std || starts_with(option, "-std") || starts_with(option, "--std");
  }
  std::vector<std::string> options = {
      fmt::format("--gpu-architecture=sm_{}{}", target.sm, src.arch_specific ? "a" : "")};
  if (!has_std) options.push_back("-std=c++17");
  options.insert(options.end(), src.options.begin(), src.options.end());
  return options;
}

std::string program_log(nvrtcProgram program) {
  std::size_t size = 0;
  KILN_NVRTC_CHECK(nvrtcGetProgramLogSize(program, &size));
  std::string text(size, '\0');
  if (size > 0) KILN_NVRTC_CHECK(nvrtcGetProgramLog(program, text.data()));
  while (!text.empty() && (text.back() == '\0' || text.back() == '\n')) text.pop_back();
  return text;
}

std::string numbered(const std::string& code) {
  std::istringstream lines(code);
  std::string out, line;
  for (int number = 1; std::getline(lines, line); ++number)
    out += fmt::format("{:>5} | {}\n", number, line);
  return out;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& word : words) out += (out.empty() ? "" : " ") + word;
  return out;
}

}  // namespace

std::vector<char> compile_to_cubin(const KernelSource& src, const JitTarget& target) {
  KILN_CHECK(!src.name.empty(), "compile_to_cubin: the kernel has no name (source of {} bytes)",
             src.code.size());
  KILN_CHECK(target.sm >= 10 && target.sm < 1000, "kernel '{}': sm_{} is not a GPU architecture",
             src.name, target.sm);
  const std::vector<std::string> options = nvrtc_options(src, target);
  std::vector<const char*> option_ptrs;
  for (const std::string& option : options) option_ptrs.push_back(option.c_str());

  Program program(src);
  const nvrtcResult result =
      nvrtcCompileProgram(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  const std::string log_text = program_log(program.get());
  if (result != NVRTC_SUCCESS) {
    throw Error(
        fmt::format("NVRTC failed to compile kernel '{}' for sm_{}: {}\noptions: "
                    "{}\nlog:\n{}\nsource of '{}':\n{}",
                    src.name, target.sm, nvrtcGetErrorString(result), joined(options), log_text,
                    src.name, numbered(src.code)));
  }
  if (!log_text.empty()) log().debug("NVRTC log for kernel {}:\n{}", src.name, log_text);

  std::size_t size = 0;
  KILN_NVRTC_CHECK(nvrtcGetCUBINSize(program.get(), &size));
  KILN_ASSERT(size > 0, "NVRTC returned an empty CUBIN for kernel {}", src.name);
  std::vector<char> cubin(size);
  KILN_NVRTC_CHECK(nvrtcGetCUBIN(program.get(), cubin.data()));
  return cubin;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  KILN_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  return fmt::format("{}.{}", major, minor);
}

}  // namespace kiln::gpu
