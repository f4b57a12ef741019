// `ktier bench device`: the device's own limits and the GPU kernels against them (issue 6).
//
//   copy_gbps      device-to-device copy of --bytes, counted as bytes read + bytes written
//                  (the memory traffic a copy makes), best of --passes
//   h2d_gbps       host-to-device upload of --bytes / 4 from ordinary (pageable) host memory
//   h2d_pinned_gbps the same from page-locked host memory on a copy queue: the link the RAM
//                  tier's expert copies and the streamed trunk layers take in GPU mode (0, with
//                  a warning, where the memory cannot be page-locked)
//   bf16_gemv_gbps linear() of a BF16 matrix of about --bytes, one token: weight bytes / s
//   mxfp4_gemv_gbps the same for an MXFP4 matrix (packed bytes + scales)
//   *_ratio        a GEMV figure over copy_gbps (goal >= 0.7: the kernel streams its weights
//                  at 70% of what the device's memory delivers to a copy)
// Every figure is bytes / seconds / 1e9 of the best timed pass after one untimed warm-up; a pass
// is timed from issue to synchronize.
//
//   ktier bench device [--device cuda|emulated] [--bytes SIZE] [--passes N] [--json FILE]
//
// Exit codes: 0 measured, 1 a device failure, 2 bad options or no usable device (as
// `run --device cuda`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda_backend.h"
#include "backend/device_choice.h"
#include "cli/commands.h"
#include "common/json_text.h"
#include "common/size.h"
#include "cpu/thread_pool.h"
#include "io/output_file.h"
#include "runtime/engine.h"

namespace ktier::cli {
namespace {

struct DeviceBenchOptions {
  std::string device = "cuda", bytes = "1G", json;
  int passes = 5;
};

template <class F>
Result<double> best_seconds(backend::Backend& be, int passes, F&& issue) {
  KTIER_RETURN_IF_ERROR(issue());  // warm-up
  KTIER_RETURN_IF_ERROR(be.synchronize());
  double best = 1e300;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    KTIER_RETURN_IF_ERROR(issue());
    KTIER_RETURN_IF_ERROR(be.synchronize());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// A random weight of about `bytes` in device memory: rows x cols with cols = 7168 (K3's hidden
// size, a multiple of 32), values of moderate size (finite products).
struct DeviceMatrix {
  backend::BackendBuffer data, scales;
  cpu::WeightMatrix w;
};
Result<DeviceMatrix> random_matrix(backend::Backend& be, cpu::WeightType type, uint64_t bytes) {
  const int64_t cols = 7168;
  const bool mx = type == cpu::WeightType::kMxfp4;
  const int64_t data_row = cpu::weight_row_data_bytes(type, cols);
  const int64_t scale_row = cpu::weight_row_scale_bytes(type, cols);
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(bytes) / (data_row + scale_row));
  std::mt19937_64 rng(7);
  std::vector<uint8_t> host(static_cast<size_t>(rows * data_row));
  // All 8 bytes of each draw: ~0.5 s instead of ~15 s per GB on one core (device time is short).
  for (size_t i = 0; i < host.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(host.data() + i, &r, std::min<size_t>(8, host.size() - i));
  }
  if (!mx)  // bf16 high bytes: sign + exponent near 2^0
    for (size_t i = 1; i < host.size(); i += 2) host[i] = static_cast<uint8_t>((host[i] & 0x80) | 0x3c);
  DeviceMatrix m;
  KTIER_ASSIGN_OR_RETURN(m.data, backend::BackendBuffer::allocate(be, host.size()));
  KTIER_RETURN_IF_ERROR(be.upload(m.data.get(), host.data(), host.size()));
  m.w = {type, m.data.get(), nullptr, rows, cols};
  if (mx) {
    std::vector<uint8_t> s(static_cast<size_t>(rows * scale_row));
    for (auto& b : s) b = static_cast<uint8_t>(120 + rng() % 10);
    KTIER_ASSIGN_OR_RETURN(m.scales, backend::BackendBuffer::allocate(be, s.size()));
    KTIER_RETURN_IF_ERROR(be.upload(m.scales.get(), s.data(), s.size()));
    m.w.scales = m.scales.as<uint8_t>();
  }
  return m;
}

Status run_device_bench(const DeviceBenchOptions& o) {
  KTIER_ASSIGN_OR_RETURN(const uint64_t bytes, parse_size(o.bytes, "--bytes"));
  if (bytes < (uint64_t{1} << 20))  // a ratio of two launch latencies is no bandwidth (0: inf)
    return Status::usage("--bytes must be at least 1M (got " + o.bytes + "): smaller transfers "
                         "time the launch, not the bandwidth");
  if (o.passes < 1) return Status::usage("--passes must be >= 1");
  KTIER_RETURN_IF_ERROR(io::check_can_write("--json", o.json));
  cpu::ThreadPool pool(1);
  std::unique_ptr<backend::Backend> be;
  if (o.device == "emulated") {
    be = backend::make_emulated_device_backend(cpu::Exec{&pool, cpu::best_isa()});
  } else if (o.device == "cuda") {
    // Exit 2 with the reason where CUDA cannot be used, as `run --device cuda`.
    const auto module = backend::probe_cuda_module();
    KTIER_RETURN_IF_ERROR(backend::choose_device(backend::DeviceRequest::kCuda, module).status());
    KTIER_ASSIGN_OR_RETURN(be, backend::make_cuda_backend(module));
  } else {
    return Status::usage("--device: '" + o.device + "' is not cuda or emulated");
  }

  // Each figure is printed as it is measured: a later step failing (a kernel fault, the caller's
  // timeout) leaves the earlier ones on the screen.
  std::printf("ktier bench device: %s, %.0f MB buffers, best of %d\n", be->name().c_str(),
              static_cast<double>(bytes) / 1e6, o.passes);
  std::fflush(stdout);
  auto figure = [](const char* name, double gbps, const char* what) {
    std::printf("%-16s %8.1f  %s\n", name, gbps, what);
    std::fflush(stdout);
  };
  // Copy: two buffers of `bytes`.
  double copy_gbps = 0, h2d_gbps = 0, h2d_pinned_gbps = 0;
  {
    KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer a, backend::BackendBuffer::allocate(*be, bytes));
    KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer b, backend::BackendBuffer::allocate(*be, bytes));
    KTIER_RETURN_IF_ERROR(be->fill(a.get(), 1, bytes));
    KTIER_ASSIGN_OR_RETURN(const double s, best_seconds(*be, o.passes, [&] {
                             return be->copy(b.get(), a.get(), bytes);
                           }));
    copy_gbps = 2.0 * static_cast<double>(bytes) / s / 1e9;
    figure("copy_gbps", copy_gbps, "(device to device, read + write)");
    std::vector<uint8_t> host(bytes / 4, 3);
    KTIER_ASSIGN_OR_RETURN(const double u, best_seconds(*be, o.passes, [&] {
                             return be->upload(a.get(), host.data(), host.size());
                           }));
    h2d_gbps = static_cast<double>(host.size()) / u / 1e9;
    figure("h2d_gbps", h2d_gbps, "(host to device, pageable host memory)");
    // Refused (RLIMIT_MEMLOCK, a sandbox), GPU mode runs on from pageable memory: so does this,
    // the figure 0 and the reason said, the others still measured.
    if (const Status pinned = be->pin_host(host.data(), host.size()); !pinned.is_ok()) {
      std::fprintf(stderr, "ktier bench device: host memory not page-locked (%s): "
                   "h2d_pinned_gbps 0\n", pinned.message().c_str());
    } else {
      const auto q = backend::Backend::CopyQueue::kExperts;
      const Result<double> p = best_seconds(*be, o.passes, [&] {
        KTIER_RETURN_IF_ERROR(be->copy_async(q, a.get(), host.data(), host.size()));
        return be->sync_copies(q);
      });
      be->unpin_host(host.data());  // copies done or failed: sync_copies returned
      if (!p.is_ok()) return p.status();
      h2d_pinned_gbps = static_cast<double>(host.size()) / *p / 1e9;
    }
    figure("h2d_pinned_gbps", h2d_pinned_gbps, "(host to device, page-locked memory, copy queue)");
  }
  // GEMV, one token, on a matrix of about `bytes`.
  auto gemv = [&](cpu::WeightType type) -> Result<double> {
    KTIER_ASSIGN_OR_RETURN(DeviceMatrix m, random_matrix(*be, type, bytes));
    std::vector<float> x(static_cast<size_t>(m.w.cols));
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& v : x) v = d(rng);
    KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer dx, backend::BackendBuffer::allocate(*be, x.size() * 4));
    KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer dy,
                           backend::BackendBuffer::allocate(*be, static_cast<size_t>(m.w.rows) * 4));
    KTIER_RETURN_IF_ERROR(be->upload(dx.get(), x.data(), x.size() * 4));
    const cpu::LinearJob job{m.w, dx.as<float>(), 1, dy.as<float>()};
    KTIER_ASSIGN_OR_RETURN(const double s, best_seconds(*be, o.passes, [&] { return be->linear(&job, 1); }));
    const double wbytes = static_cast<double>(backend::weight_data_bytes(m.w) +
                                              backend::weight_scale_bytes(m.w));
    return wbytes / s / 1e9;
  };
  auto gemv_figure = [&](const char* name, double gbps) {
    char what[64];
    std::snprintf(what, sizeof(what), "ratio %.3f  (goal >= 0.7)", gbps / copy_gbps);
    figure(name, gbps, what);
  };
  KTIER_ASSIGN_OR_RETURN(const double bf16, gemv(cpu::WeightType::kBF16));
  gemv_figure("bf16_gemv_gbps", bf16);
  KTIER_ASSIGN_OR_RETURN(const double mxfp4, gemv(cpu::WeightType::kMxfp4));
  gemv_figure("mxfp4_gemv_gbps", mxfp4);
  if (!o.json.empty()) {
    const nlohmann::json j{{"device", be->name()},      {"bytes", bytes},
                           {"passes", o.passes},        {"copy_gbps", copy_gbps},
                           {"h2d_gbps", h2d_gbps},      {"h2d_pinned_gbps", h2d_pinned_gbps},
                           {"bf16_gemv_gbps", bf16},
                           {"bf16_ratio", bf16 / copy_gbps}, {"mxfp4_gemv_gbps", mxfp4},
                           {"mxfp4_ratio", mxfp4 / copy_gbps}};
    KTIER_RETURN_IF_ERROR(io::write_output_file(o.json, json_output_text(j)));
  }
  return Status::ok();
}

}  // namespace

void register_bench_device_command(CLI::App& bench, int& exit_code) {
  auto* sub = bench.add_subcommand(
      "device",
      "GPU: device copy and host-to-device GB/s, and the BF16/MXFP4 GEMV kernels as a ratio of\n"
      "the copy (goal >= 0.7); --device emulated runs it on the CPU kernels (a smoke test)");
  auto o = std::make_shared<DeviceBenchOptions>();
  sub->add_option("--device", o->device, "cuda or emulated")->capture_default_str();
  sub->add_option("--bytes", o->bytes, "buffer and matrix size, at least 1M (e.g. 1G, 64M)")
      ->capture_default_str();
  sub->add_option("--passes", o->passes, "timed passes, best kept")->capture_default_str();
  sub->add_option("--json", o->json, "also write the figures to FILE as JSON");
  sub->callback([o, &exit_code] { exit_code = finish(run_device_bench(*o)); });
}

}  // namespace ktier::cli
