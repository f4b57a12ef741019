// `ktier doctor`: what this machine offers ktier (CPU features, cores, memory, GPU module).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "backend/cuda_module.h"
#include "cli/commands.h"
#include "common/size.h"
#include "cpu/cpu_features.h"
#include "cpu/exec.h"
#include "ktier/version.h"
#include "runtime/engine_plan.h"

namespace ktier::cli {
namespace {

Status run_doctor() {
  const auto& f = cpu::cpu_features();
  std::printf("ktier %s (%s)\n", kVersion, kGitRevision);
  const bool avx512 = f.avx512_subsets();
  std::printf("cpu: %ld online cores, avx2=%s fma=%s f16c=%s avx512=%s%s -> %s kernels "
              "(--isa auto)\n",
              sysconf(_SC_NPROCESSORS_ONLN), f.avx2 ? "yes" : "no", f.fma ? "yes" : "no",
              f.f16c ? "yes" : "no", avx512 ? "yes" : "no",
              avx512 && !f.os_avx512 ? " (zmm state not saved by the OS)" : "",
              cpu::isa_name(cpu::best_isa()));
  const runtime::MemInfo mem = runtime::read_meminfo();
  const Result<uint64_t> preset = runtime::preset_budget_bytes("auto");
  std::printf("memory: MemTotal %s, MemAvailable %s; --preset auto (the default with "
              "--pack or in GPU mode) budgets %s\n",
              format_size(mem.total).c_str(), format_size(mem.available).c_str(),
              preset.is_ok() ? format_size(*preset).c_str() : preset.status().message().c_str());
  std::printf("%s\n", backend::describe_cuda(backend::probe_cuda_module()).c_str());
  return Status::ok();
}

}  // namespace

void register_doctor_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("doctor", "Report what this machine offers ktier");
  sub->callback([&exit_code] { exit_code = finish(run_doctor()); });
}

}  // namespace ktier::cli
