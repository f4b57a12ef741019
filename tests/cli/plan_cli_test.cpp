// `ktier plan` on the tiny seed-0 checkpoint: what it says a run would hold is what the run
// then holds (its report), from the shards and from packs, on the CPU and on the emulated
// device, and a budget below the minimum is refused as `run` refuses it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_process.h"
#include "common/size.h"
#include "tests/cli/run_cli_fixture.h"

namespace ktier::test {
namespace {

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(std::ifstream(p)); }

// `ktier plan` and `ktier run -n 2` (one decode step) with the same flags `flags`: the plan's
// JSON and the run's report.
struct PlanAndRun {
  nlohmann::json plan, report;
  std::string run_log;  // the run's stderr
};
PlanAndRun plan_and_run(const std::string& model, const std::string& ids, const fs::path& base,
                        const std::string& flags) {
  PlanAndRun out;
  const fs::path plan = base.string() + "-plan.json", report = base.string() + "-report.json";
  ProcessResult r = run_process(ktier() + " plan" + model + flags + " --json " + plan.string());
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  if (r.exit_code != 0) return out;
  out.plan = read_json(plan);
  r = run_process(ktier() + " run" + model + " --ids " + ids + " -n 2" + flags +
                  " --report-json " + report.string());
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  out.run_log = r.err;
  if (r.exit_code == 0) out.report = read_json(report);
  return out;
}

void expect_dial_matches(const PlanAndRun& pr, const std::string& flags) {
  SCOPED_TRACE(flags);
  ASSERT_FALSE(pr.plan.is_null());
  ASSERT_FALSE(pr.report.is_null());
  const nlohmann::json& d = pr.plan.at("dial");
  const nlohmann::json& j = pr.report;
  EXPECT_EQ(d.at("budget_bytes"), j.at("budget_bytes"));
  EXPECT_EQ(pr.plan.at("lookahead"), j.at("lookahead"));
  EXPECT_EQ(d.at("trunk_layers_pinned"), j.at("trunk_layers_pinned"));
  EXPECT_EQ(d.at("trunk_layers_streamed"), j.at("trunk_layers_streamed"));
  EXPECT_EQ(d.at("trunk_bytes"), j.at("trunk_bytes"));
  EXPECT_EQ(d.at("router_bank_bytes"), j.at("router_bank_bytes"));
  EXPECT_EQ(d.at("ram_expert_slots_here"), j.at("tiers").at("ram").at("slots"));
  EXPECT_EQ(d.at("ram_expert_policy_slots"), j.at("tiers").at("ram").at("policy_slots"));
  // The one decode step reads each layer neither pinned nor resident once.
  EXPECT_EQ(d.at("trunk_read_bytes_per_token").get<double>(),
            j.at("bytes_read_per_token").at("trunk").get<double>());
  EXPECT_LE(d.at("held_bytes").get<uint64_t>(), d.at("budget_bytes").get<uint64_t>());
}

// From the minimum (the plan's own figure) to every layer pinned, from the shards, a pack and a
// compressed pack; one byte below the minimum automatic lookahead is off, in both.
TEST_F(RunEvalCli, PlanHoldsWhatTheRunHoldsAtEveryBudget) {
  const fs::path pack = dir_.string() + "-plan-pack", packz = dir_.string() + "-plan-packz";
  for (const auto& [out, extra] : {std::pair{pack, ""}, std::pair{packz, " --compress"}}) {
    const ProcessResult r = run_process(ktier() + " pack -q --force" + model() + " -o " +
                                        out.string() + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  int checked = 0, without_lookahead = 0;
  bool streamed = false, all_pinned = false;
  for (const std::string& source : {std::string(), " --pack " + pack.string(),
                                   " --pack " + packz.string() + " -t 2"}) {
    const std::string common = source + " -c 40";
    const fs::path min_json = dir_.string() + "-plan-min.json";
    const ProcessResult big = run_process(ktier() + " plan" + model() + common +
                                          " --ram 64M --json " + min_json.string());
    ASSERT_EQ(big.exit_code, 0) << big.err;
    const uint64_t minimum = read_json(min_json).at("dial").at("minimum_bytes");
    for (const uint64_t budget : {minimum - 1, minimum, minimum + 300'000, minimum + 900'000,
                                  uint64_t{64} << 20}) {
      const std::string flags = common + " --ram " + std::to_string(budget);
      const PlanAndRun pr = plan_and_run(model(), prompt_ids(), dir_.string() + "-plan", flags);
      expect_dial_matches(pr, flags);
      if (pr.plan.is_null()) continue;
      const int pinned = pr.plan.at("dial").at("trunk_layers_pinned");
      streamed |= pinned < pr.plan.at("layers").get<int>();
      all_pinned |= pinned == pr.plan.at("layers").get<int>();
      if (pr.plan.at("lookahead") == 0) {
        ++without_lookahead;
        EXPECT_NE(pr.run_log.find("lookahead off: the budget of "), std::string::npos)
            << pr.run_log;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 15);
  EXPECT_EQ(without_lookahead, 3) << "one byte below the minimum with lookahead, and only there";
  EXPECT_TRUE(streamed && all_pinned) << "the budgets should span streamed and pinned trunks";
}

// A plan holding more than the machine has free (here `max`, with KTIER_DEBUG_MEM_AVAILABLE_MIB
// standing in for a smaller machine) is made again at 90% of MemAvailable before anything is
// read: the run pins fewer layers, as `plan` said it would and as `plan --ram` at that budget
// places them, and its ids are those of the run that pinned everything; on the emulated device
// too (the host pins the layers it streams). A budget above 90% whose plan fits is kept. Below
// every minimum, the least a run needs (automatic lookahead off).
TEST_F(RunEvalCli, ABudgetPastTheMachinesMemoryIsLoweredToFitIt) {
  const fs::path json = dir_.string() + "-fit.json", report = dir_.string() + "-fit-report.json";
  const auto plan_dial = [&](const std::string& env, const std::string& flags) {
    const ProcessResult r =
        run_process(env + ktier() + " plan" + model() + flags + " --json " + json.string());
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
    return r.exit_code == 0 ? read_json(json).at("dial") : nlohmann::json();
  };
  const auto mem = [](uint64_t mib) {
    return "KTIER_DEBUG_MEM_AVAILABLE_MIB=" + std::to_string(mib) + " ";
  };
  const std::string ids = " --ids " + prompt_ids() + " -n 8 --temp 0 --print-ids -c 40";
  const ProcessResult want = run_process(ktier() + " run" + model() + ids + " --preset max");
  ASSERT_EQ(want.exit_code, 0) << want.err;
  int lowered_runs = 0;
  for (const std::string& device : {std::string(), std::string(" --device emulated --vram ")}) {
    std::string common = " -c 40";
    if (!device.empty()) {  // the device holds about half the trunk
      const ProcessResult r = run_process(ktier() + " plan" + model() + common + device +
                                          "64M --preset max --json " + json.string());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const nlohmann::json d = read_json(json).at("device");
      const uint64_t vram = d.at("trunk_bytes").get<uint64_t>() / 2 +
                            d.at("working_set_bytes").get<uint64_t>() +
                            d.at("vram_expert_min_slots").get<uint64_t>() *
                                d.at("vram_expert_slot_bytes").get<uint64_t>();
      common += device + std::to_string(vram);
    }
    SCOPED_TRACE(common);
    const nlohmann::json all = plan_dial("", common + " --preset max");
    ASSERT_FALSE(all.is_null());
    const uint64_t minimum = all.at("minimum_bytes"), held = all.at("held_bytes");
    // A whole number of MiB whose 90% lies halfway between the minimum and what is held.
    const uint64_t mib = ((minimum + held) / 2 * 10 / 9 >> 20) + 1;
    const uint64_t room = (mib << 20) / 10 * 9;
    ASSERT_TRUE(minimum < room && room < held) << minimum << " " << room << " " << held;
    const nlohmann::json here = plan_dial(mem(mib), common + " --preset max");
    ASSERT_FALSE(here.is_null());
    EXPECT_EQ(here.at("budget_bytes"), all.at("budget_bytes"));  // the plan as asked, and
    EXPECT_EQ(here.at("budget_bytes_here").get<uint64_t>(), room);  // what a run here opens
    const nlohmann::json at_room = plan_dial("", common + " --ram " + std::to_string(room));
    ASSERT_FALSE(at_room.is_null());
    EXPECT_EQ(here.at("trunk_layers_pinned_here"), at_room.at("trunk_layers_pinned"));
    EXPECT_EQ(here.at("ram_expert_slots_here"), at_room.at("ram_expert_slots"));
    EXPECT_LE(at_room.at("held_bytes").get<uint64_t>(), room);
    const auto placed = [](const nlohmann::json& d) {  // fewer of either at the lower budget
      return d.at("ram_expert_slots").get<int>() + d.at("trunk_layers_pinned").get<int>();
    };
    EXPECT_LT(placed(at_room), placed(all));

    const ProcessResult lowered = run_process(mem(mib) + ktier() + " run" + model() + ids +
                                              common + " --preset max --report-json " +
                                              report.string());
    ASSERT_EQ(lowered.exit_code, 0) << lowered.err;
    EXPECT_EQ(lowered.out, want.out);
    EXPECT_NE(lowered.err.find("budget lowered from max to " + format_size(room) +
                               ", 90% of MemAvailable"),
              std::string::npos)
        << lowered.err;
    const nlohmann::json j = read_json(report);
    EXPECT_EQ(j.at("budget_bytes").get<uint64_t>(), room);
    EXPECT_EQ(j.at("trunk_layers_pinned"), at_room.at("trunk_layers_pinned"));
    EXPECT_EQ(j.at("tiers").at("ram").at("slots"), at_room.at("ram_expert_slots"));
    ++lowered_runs;

    // Everything held fits in 90% of a little more: --ram 64M is kept.
    const uint64_t roomy = (held * 10 / 9 >> 20) + 1;
    const ProcessResult kept = run_process(mem(roomy) + ktier() + " run" + model() + ids +
                                           common + " --ram 64M --report-json " +
                                           report.string());
    ASSERT_EQ(kept.exit_code, 0) << kept.err;
    EXPECT_EQ(kept.err.find("budget lowered"), std::string::npos) << kept.err;
    EXPECT_EQ(read_json(report).at("budget_bytes").get<uint64_t>(), uint64_t{64} << 20);
  }
  EXPECT_EQ(lowered_runs, 2);

  // 1 MiB: 90% of it is below every minimum; the run holds the least it needs, without
  // lookahead (automatic), and says so.
  const nlohmann::json least = plan_dial("", " -c 40 --lookahead 0 --preset max");
  ASSERT_FALSE(least.is_null());
  const ProcessResult tight = run_process(mem(1) + ktier() + " run" + model() + ids +
                                          " --ram 64M --report-json " + report.string());
  ASSERT_EQ(tight.exit_code, 0) << tight.err;
  EXPECT_EQ(tight.out, want.out);
  EXPECT_NE(tight.err.find("budget lowered from 64.00 MiB to " +
                           format_size(least.at("minimum_bytes").get<uint64_t>()) +
                           ", the least a run needs"),
            std::string::npos)
      << tight.err;
  EXPECT_NE(tight.err.find("lookahead 0 instead of 1"), std::string::npos) << tight.err;
  const nlohmann::json j = read_json(report);
  EXPECT_EQ(j.at("budget_bytes"), least.at("minimum_bytes"));
  EXPECT_EQ(j.at("lookahead"), 0);
  // Asked for the least itself, past MemAvailable (a longer context sets more aside for the
  // sequence): nothing to lower, but the machine is said to be short.
  const std::string longer = " --ids " + prompt_ids() + " -n 8 --temp 0 --print-ids -c 1000";
  const nlohmann::json least_longer = plan_dial("", " -c 1000 --lookahead 0 --preset max");
  ASSERT_FALSE(least_longer.is_null());
  ASSERT_GT(least_longer.at("minimum_bytes").get<uint64_t>(), uint64_t{1} << 20);
  const ProcessResult at_least =
      run_process(mem(1) + ktier() + " run" + model() + longer + " --lookahead 0 --ram " +
                  std::to_string(least_longer.at("minimum_bytes").get<uint64_t>()));
  ASSERT_EQ(at_least.exit_code, 0) << at_least.err;
  EXPECT_EQ(at_least.out, want.out);
  EXPECT_EQ(at_least.err.find("budget lowered"), std::string::npos) << at_least.err;
  EXPECT_NE(at_least.err.find("more than the 1.00 MiB MemAvailable, and is the least this run "
                              "needs: the system may end it for memory"),
            std::string::npos)
      << at_least.err;
}

// --preset auto (the default with a pack and in GPU mode) leaves half of MemAvailable to the
// system below 4 GiB free. Where that is below the run's minimum the run takes 90% of
// MemAvailable, as a larger --ram is lowered to, with the same ids (a probe's find: it was
// refused where --ram 6M ran); where even that is short, it is refused (exit 4) saying the
// budget was auto's.
TEST_F(RunEvalCli, AnAutomaticBudgetBelowTheMinimumIsRaisedTo90PercentOfMemAvailable) {
  const std::string mem = "KTIER_DEBUG_MEM_AVAILABLE_MIB=1 ";  // auto: 512 KiB
  const std::string ids = " --ids 1,2,3,4,5,6 -n 11 --temp 0 --print-ids";
  const fs::path report = dir_.string() + "-auto-report.json";
  const ProcessResult want = run_process(ktier() + " run" + model() + ids + " --preset max");
  ASSERT_EQ(want.exit_code, 0) << want.err;
  const std::string raised = "--preset auto's budget of 512.00 KiB is below this run's minimum: " +
                             format_size((uint64_t{1} << 20) / 10 * 9) +
                             " instead, 90% of MemAvailable (1.00 MiB)";
  const ProcessResult r = run_process(mem + ktier() + " run" + model() + ids +
                                      " --preset auto --report-json " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want.out);
  EXPECT_NE(r.err.find(raised), std::string::npos) << r.err;
  EXPECT_EQ(read_json(report).at("budget_bytes").get<uint64_t>(), (uint64_t{1} << 20) / 10 * 9);
  const ProcessResult plan =
      run_process(mem + ktier() + " plan" + model() + " -c 16 --preset auto");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("note: " + raised), std::string::npos) << plan.out;
  const ProcessResult refused =
      run_process(mem + ktier() + " run" + model() + ids + " -c 3000 --preset auto");
  EXPECT_EQ(refused.exit_code, 4) << refused.err;
  EXPECT_NE(refused.err.find("It is --preset auto's budget of 512.00 KiB (MemAvailable 1.00 MiB), "
                             "and not even 90% of MemAvailable holds this run"),
            std::string::npos)
      << refused.err;
  fs::remove(report);
}

// GPU mode's placement on the emulated device: the device's working set, resident layers and
// VRAM slots, and the host's pinned suffix and what it reads from disk (with the ring freed
// when it pins every layer the device streams).
TEST_F(RunEvalCli, PlanPlacesTheDeviceAsTheEmulatedRunDoes) {
  const PlanAndRun all = plan_and_run(model(), prompt_ids(), dir_.string() + "-plan-dev",
                                      " -c 40 --device emulated --vram 64M --ram 64M");
  ASSERT_FALSE(all.plan.is_null());
  ASSERT_FALSE(all.report.is_null());
  const nlohmann::json& d = all.plan.at("device");
  const uint64_t trunk = d.at("trunk_bytes"), working = d.at("working_set_bytes");
  const uint64_t slot = d.at("vram_expert_slot_bytes"), min_slots = d.at("vram_expert_min_slots");
  int checked = 0;
  bool ring_freed = false, from_disk = false;
  for (const uint64_t vram : {uint64_t{64} << 20, trunk / 2 + working + min_slots * slot,
                              trunk + working + (min_slots + 5) * slot}) {
    for (const char* ram : {"64M", "1500K"}) {
      const std::string flags = " -c 40 --device emulated --vram " + std::to_string(vram) +
                                " --ram " + ram;
      SCOPED_TRACE(flags);
      const PlanAndRun pr = plan_and_run(model(), prompt_ids(), dir_.string() + "-plan-dev", flags);
      if (pr.plan.is_null() || pr.report.is_null()) continue;
      const nlohmann::json& p = pr.plan.at("device");
      const nlohmann::json& j = pr.report.at("device");
      EXPECT_EQ(p.at("vram_budget_bytes"), j.at("vram_budget_bytes"));
      EXPECT_EQ(p.at("working_set_bytes"), j.at("working_set_bytes"));
      EXPECT_EQ(p.at("trunk_layers_resident"), j.at("trunk_layers_resident"));
      EXPECT_EQ(p.at("trunk_bytes"), j.at("trunk_bytes"));
      EXPECT_EQ(p.at("vram_expert_slots"), pr.report.at("tiers").at("vram").at("slots"));
      expect_dial_matches(pr, flags);
      const nlohmann::json& h = pr.plan.at("dial");
      ring_freed |= h.at("trunk_ring_slots") == 0 &&
                    h.at("trunk_layers_pinned") < pr.plan.at("layers");
      from_disk |= h.at("trunk_layers_streamed") > 0;
      // The device mirrors the head: the host's copy is freed (trunk_bytes, compared above,
      // is what the run's store holds after it).
      EXPECT_GT(h.at("trunk_head_released_bytes").get<uint64_t>(), 0u);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
  EXPECT_TRUE(ring_freed && from_disk) << "the budgets should free the ring and stream layers";
}

TEST_F(RunEvalCli, PlanRefusesABudgetAsTheRunDoes) {
  const std::string flags = " -c 40 --ram 100K";
  const ProcessResult plan = run_process(ktier() + " plan" + model() + flags);
  const ProcessResult run =
      run_process(ktier() + " run" + model() + " --ids " + prompt_ids() + " -n 2" + flags);
  EXPECT_EQ(plan.exit_code, 4) << plan.err;
  EXPECT_EQ(run.exit_code, 4) << run.err;
  EXPECT_EQ(last_line(plan.err), last_line(run.err));
  EXPECT_NE(plan.err.find("cannot be met: the minimum is"), std::string::npos) << plan.err;
  // eval has no -c: its positions are the ids given, and its refusal says so.
  const ProcessResult eval = run_process(ktier() + " eval" + model() + " --ids " + prompt_ids() +
                                         " --argmax --ram 100K");
  EXPECT_EQ(eval.exit_code, 4) << eval.err;
  EXPECT_NE(eval.err.find(" positions (the ids given))"), std::string::npos) << eval.err;
  const ProcessResult vram = run_process(ktier() + " plan" + model() +
                                         " --device emulated --vram 100K");
  EXPECT_EQ(vram.exit_code, 4) << vram.err;
  EXPECT_NE(vram.err.find("--vram 102400 bytes cannot hold"), std::string::npos) << vram.err;
  // It names what sets the sequence's share (a large -c can be what is short).
  EXPECT_NE(vram.err.find("The sequence's working set: "), std::string::npos) << vram.err;
  EXPECT_NE(vram.err.find(" for 4096 positions, from -c; by default the prompt and -n"),
            std::string::npos)
      << vram.err;
  // (The host's budget, --preset auto's here, is not what is short.)
  EXPECT_EQ(vram.err.find("--preset auto"), std::string::npos) << vram.err;
  const ProcessResult no_vram = run_process(ktier() + " plan" + model() + " --device emulated");
  EXPECT_EQ(no_vram.exit_code, 2) << no_vram.err;
  EXPECT_NE(no_vram.err.find("needs --vram"), std::string::npos) << no_vram.err;
}

// Without --ram, --preset or --pack the checkpoint is mapped: the plan says so, with the
// trunk's size, and holds no dial.
TEST_F(RunEvalCli, PlanOfAMappedCheckpointSaysSo) {
  const fs::path json = dir_.string() + "-plan-mapped.json";
  const ProcessResult r =
      run_process(ktier() + " plan" + model() + " --device cpu --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("memory-mapped"), std::string::npos) << r.out;
  const nlohmann::json j = read_json(json);
  EXPECT_TRUE(j.at("dial").is_null());
  EXPECT_TRUE(j.at("device").is_null());
  EXPECT_GT(j.at("mapped").at("trunk_layer_bytes").get<uint64_t>(), 0u);
  EXPECT_EQ(j.at("positions"), 4096);
  EXPECT_EQ(j.at("notes"), nlohmann::json::array());
  EXPECT_EQ(r.out.find("note:"), std::string::npos) << r.out;
  // The dial's options a mapped run ignores are notes, as the run's warnings (run_errors_test).
  const ProcessResult unused =
      run_process(ktier() + " plan" + model() + " --device cpu --policy lru --io pread " +
                  "--lookahead 2 --json " + json.string());
  ASSERT_EQ(unused.exit_code, 0) << unused.err;
  for (const char* note : {"note: --policy/--profile ignored: the checkpoint is memory-mapped",
                           "note: --io/--io-rate-limit ignored: the checkpoint is memory-mapped",
                           "note: --lookahead reads nothing ahead: the checkpoint is "})
    EXPECT_NE(unused.out.find(note), std::string::npos) << note << "\n" << unused.out;
  const nlohmann::json notes = read_json(json).at("notes");
  ASSERT_EQ(notes.size(), 3u) << notes;
  EXPECT_EQ(notes[1], "--io/--io-rate-limit ignored: the checkpoint is memory-mapped (give "
                      "--pack, --ram or --preset)");
  fs::remove(json);
}

// A `synth --shapes-only` checkpoint (every shard at its real size, the data holes) in a
// temporary folder, removed with the object. Where the file system keeps no holes synth refuses
// (exit 1) and a test skips; any other failure is the test's.
struct ShapesOnlyModel {
  fs::path dir;
  ProcessResult made;
  ShapesOnlyModel(const std::string& name, const std::string& synth_flags)
      : dir(fs::temp_directory_path() / ("ktier-" + name + "-" + std::to_string(::getpid()))),
        made(run_process(ktier() + " synth " + synth_flags + " --shapes-only -q -o " +
                         dir.string())) {}
  ShapesOnlyModel(const ShapesOnlyModel&) = delete;
  ShapesOnlyModel& operator=(const ShapesOnlyModel&) = delete;
  ~ShapesOnlyModel() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  bool no_holes() const {
    return made.exit_code == 1 && made.err.find("does not keep holes") != std::string::npos;
  }
};

// Planned for serve, eval or perplexity (--for), the sequence sets aside every position's logits
// of a chunk where run keeps the last one's: on a model whose vocabulary is wide enough that
// they are the largest scratch (on K3 a block's own scratch is larger still), 256 x 65,536
// floats (67 MB) more.
TEST(PlanFor, ServeEvalAndPerplexityHoldEveryPositionsLogits) {
  const ShapesOnlyModel wide("plan-for", "--preset tiny --vocab 65536");
  if (wide.no_holes()) GTEST_SKIP() << "the temporary folder's file system has no sparse files";
  ASSERT_EQ(wide.made.exit_code, 0) << wide.made.err;
  const fs::path& dir = wide.dir;
  const auto sequence = [&](const std::string& flags, const std::string& rows) -> uint64_t {
    const fs::path json = dir / "plan.json";
    const ProcessResult p = run_process(ktier() + " plan -m " + dir.string() +
                                        " --device cpu --ram 1G" + flags + " --json " +
                                        json.string());
    EXPECT_EQ(p.exit_code, 0) << flags << "\n" << p.err;
    if (p.exit_code != 0) return 0;
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j.at("logit_rows"), rows) << flags;
    return j.at("dial").at("sequence_bytes").get<uint64_t>();
  };
  const uint64_t run = sequence("", "last"), serve = sequence(" --for serve", "all");
  EXPECT_GT(serve, run + 256ull * 65536 * 4 * 9 / 10) << run << " " << serve;
  // Each command's own defaults: eval's one pass over every id (-c of them), perplexity's
  // windows of 512 in passes of 256.
  EXPECT_EQ(sequence(" --for eval --chunk 256", "all"), serve);
  EXPECT_GT(sequence(" --for eval -c 1024", "all"), serve);
  EXPECT_EQ(sequence(" --for eval -c 1024", "all"),
            sequence(" --for serve -c 1024 --chunk 1024", "all"));
  // eval's own --chunk 0 (its default: one pass) is taken too.
  EXPECT_EQ(sequence(" --for eval -c 1024 --chunk 0", "all"),
            sequence(" --for eval -c 1024", "all"));
  EXPECT_EQ(run_process(ktier() + " plan -m " + dir.string() + " --chunk 0").exit_code, 2);
  EXPECT_EQ(sequence(" --for perplexity", "all"), sequence(" --for serve -c 512", "all"));
  EXPECT_LT(sequence(" --for perplexity", "all"), serve);
  EXPECT_EQ(sequence(" --for run", "last"), run);
  EXPECT_EQ(run_process(ktier() + " plan -m " + dir.string() + " --for bench").exit_code, 2);
}

// K3's own layout (`synth --shapes-only`: every shard at its real size, the data holes, ~130 MB
// of headers on disk): the figures K3-MODEL.md states, the minimum as the refusal states it,
// and more budget pinning more layers.
TEST(PlanK3, PlansTheReleasedShapes) {
  const ShapesOnlyModel k3("plan-k3", "--preset k3-slice --layers 93 --experts 896");
  if (k3.no_holes()) GTEST_SKIP() << "the temporary folder's file system has no sparse files";
  ASSERT_EQ(k3.made.exit_code, 0) << k3.made.err;
  const fs::path& dir = k3.dir;
  ProcessResult r;
  const std::string model = " -m " + dir.string() + " --device cpu -c 4096";
  const auto plan = [&](const std::string& flags) {
    const fs::path json = dir / "plan.json";  // removed with the folder
    const ProcessResult p = run_process(ktier() + " plan" + model + flags + " --json " +
                                        json.string());
    EXPECT_EQ(p.exit_code, 0) << flags << "\n" << p.err;
    nlohmann::json j = p.exit_code == 0 ? read_json(json) : nlohmann::json();
    fs::remove(json);
    return j;
  };
  const nlohmann::json desktop = plan(" --preset desktop");
  const nlohmann::json workstation = plan(" --preset workstation");
  ASSERT_FALSE(desktop.is_null() || workstation.is_null());
  const nlohmann::json& d = desktop.at("dial");
  // One expert (K3-MODEL.md: 17,547,264 bytes) and the slack that places its six parts
  // congruent to their file offsets, for O_DIRECT (under a page each).
  const uint64_t slot = d.at("ram_expert_slot_bytes");
  EXPECT_GE(slot, 17'547'264u);
  EXPECT_LT(slot, 17'547'264u + 6 * 4096);
  EXPECT_EQ(d.at("expert_keys"), 92 * 896);
  EXPECT_EQ(desktop.at("layers"), 93);
  const int pinned32 = d.at("trunk_layers_pinned"), pinned96 = workstation.at("dial").at(
                                                         "trunk_layers_pinned");
  EXPECT_GT(pinned32, 0);
  EXPECT_GT(pinned96, pinned32);
  EXPECT_LT(workstation.at("dial").at("trunk_read_bytes_per_token").get<uint64_t>(),
            d.at("trunk_read_bytes_per_token").get<uint64_t>());
  // The minimum: met exactly, refused one byte below it in the words `run` uses (lookahead 1
  // as given; automatic, it would turn itself off).
  const uint64_t minimum = d.at("minimum_bytes");
  EXPECT_EQ(desktop.at("lookahead"), 1);
  EXPECT_FALSE(plan(" --ram " + std::to_string(minimum)).is_null());
  r = run_process(ktier() + " plan" + model + " --lookahead 1 --ram " +
                  std::to_string(minimum - 1));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("the minimum is " + format_size(minimum) + " = " +
                       std::to_string(minimum) + " bytes"),
            std::string::npos)
      << r.err;
  // A laptop's 8 GiB (--preset laptop) holds K3 without lookahead's 1.11 GiB of routers, not
  // with them: automatic lookahead is off there, and the plan says so.
  ASSERT_GT(minimum, 8ull << 30);
  const nlohmann::json laptop = plan(" --preset laptop");
  ASSERT_FALSE(laptop.is_null());
  EXPECT_EQ(laptop.at("lookahead"), 0);
  EXPECT_EQ(laptop.at("dial").at("router_bank_bytes"), 0);
  EXPECT_LE(laptop.at("dial").at("minimum_bytes").get<uint64_t>(), 8ull << 30);
  r = run_process(ktier() + " plan" + model + " --preset laptop");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("note: lookahead off: the budget of 8.00 GiB"), std::string::npos)
      << r.out;
  // GPU mode on an H200 (140 GiB; 90% of it free is the default --vram): the whole trunk, its
  // layers and lm_head (103.5 GiB), is resident.
  const nlohmann::json h200 = plan(" --device emulated --vram 125G --ram 96G");
  ASSERT_FALSE(h200.is_null());
  EXPECT_EQ(h200.at("device").at("trunk_layers_resident"), 93);
  EXPECT_GT(h200.at("device").at("vram_expert_slots").get<int>(),
            h200.at("device").at("vram_expert_min_slots").get<int>());
}

}  // namespace
}  // namespace ktier::test
