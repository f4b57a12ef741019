// `ktier doctor`: what this machine offers ktier (CPU features, cores, memory, GPU module, and
// whether cuBLAS prefill can be used).
#include <unistd.h>

#include <cstdio>
#include <string>

#include <spdlog/spdlog.h>

#include "backend/cuda_backend.h"
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
  const Result<backend::CudaModuleProbe> cuda = backend::probe_cuda_module();
  std::printf("%s\n", backend::describe_cuda(cuda).c_str());
  // Whether --gpu-prefill cublas takes effect: only opening device 0 and asking the module for
  // cuBLAS tells (it loads libcublas at run time unless linked in, and makes a handle there).
  if (cuda.is_ok() && cuda->probe.device_count > 0 &&
      backend::cuda_device_unsupported(cuda->probe, 0).empty()) {
    // The backend's own warning for a missing cuBLAS is a run's; doctor says it in its line.
    const spdlog::level::level_enum level = spdlog::get_level();
    if (level < spdlog::level::err) spdlog::set_level(spdlog::level::err);
    std::string line;
    {  // the backend closed before the level comes back
      const auto be = backend::make_cuda_backend(cuda, /*cublas_prefill=*/true);
      if (!be.is_ok())
        line = "cuda: device 0 cannot be opened: " + be.status().message();
      else if ((*be)->uses_blas())
        line = "cuda: --gpu-prefill cublas: available (cuBLAS on device 0)";
      else
        line = "cuda: --gpu-prefill cublas: unavailable, the module found no cuBLAS (the fused "
               "kernels run every prefill)";
    }
    spdlog::set_level(level);
    std::printf("%s\n", line.c_str());
  }
  return Status::ok();
}

}  // namespace

void register_doctor_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("doctor", "Report what this machine offers ktier");
  sub->callback([&exit_code] { exit_code = finish(run_doctor()); });
}

}  // namespace ktier::cli
