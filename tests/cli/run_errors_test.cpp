// Bad input to `ktier run`, `eval` and `tokenize` as the acceptance checks call them: the
// documented exit code and a message naming the file, tensor or field, never a crash or a token
// computed from bad bytes; on the tiny seed-0 checkpoint of run_eval_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <nlohmann/json.hpp>

#include "common/run_process.h"
#include "common/test_paths.h"
#include "tests/cli/run_cli_fixture.h"
#include "format/safetensors.h"

namespace ktier::test {
namespace {

namespace fs = std::filesystem;

TEST_F(RunEvalCli, BadInputsGetDocumentedExitCodes) {
  for (const auto& [args, what] : std::vector<std::pair<std::string, std::string>>{
           {" run" + model() + " --ids 1,99999 -n 1", "99999"},
           {" run" + model() + " --ids 1,x -n 1", "--ids: 'x' is not a token id"},
           {" run" + model() + " --ids 1 --temp -1", "--temp must be a finite number >= 0"},
           {" run" + model() + " --ids 1 --seed -2", "--seed: '-2' is not a whole number"},
           {" run" + model() + " --ids 1 -p hi", "give exactly one of -p TEXT, -f FILE or --ids"},
           {" run -m /nonexistent/model --ids 1", "/nonexistent/model: not a model directory"},
           {" eval" + model() + " --ids 1,2", "nothing to do: give --argmax"}}) {
    const auto bad = run_process(ktier() + args);
    EXPECT_EQ(bad.exit_code, 2) << args << ": " << bad.err;
    EXPECT_NE(bad.err.find(what), std::string::npos) << args << ": " << bad.err;
  }
  // A tokenizer whose ids run past config.json's vocab_size: the model folder is inconsistent.
  {
    const fs::path bad_tok = dir_.string() + "-badtok";
    fs::remove_all(bad_tok);
    fs::copy(dir_, bad_tok, fs::copy_options::recursive);
    nlohmann::json tc = nlohmann::json::parse(std::ifstream(bad_tok / "tokenizer_config.json"));
    auto& added = tc["added_tokens_decoder"];
    const std::string id = added.begin().key();
    const std::string content = added[id]["content"];
    added["100000"] = added[id];
    added.erase(id);
    std::ofstream(bad_tok / "tokenizer_config.json") << tc.dump();
    const auto bad = run_process(ktier() + " run -m " + bad_tok.string() + " -p 'hi" + content +
                                 "' -n 1");
    EXPECT_EQ(bad.exit_code, 3) << bad.err;
    EXPECT_NE(bad.err.find("the tokenizer's id 100000 is outside the vocabulary"),
              std::string::npos) << bad.err;
    fs::remove_all(bad_tok);
  }
  // No output may overwrite an input (the model, the pack, a trace read) or another output.
  const std::string cfg = (dir_ / "config.json").string();
  const std::string cfg_before = [&] {
    std::ifstream in(cfg);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const std::string trace_out = dir_.string() + "-same.ktrace";
  // Another name of config.json, outside the folder: the same file.
  const fs::path cfg_link = fs::temp_directory_path() / ("ktier-cli-cfg-" + std::to_string(::getpid()));
  fs::remove(cfg_link);
  fs::create_hard_link(cfg, cfg_link);
  for (const auto& [args, what] : std::vector<std::pair<std::string, std::string>>{
           {" run" + model() + " --ids 1 -n 1 --report-json " + cfg, "is inside -m"},
           {" run" + model() + " --ids 1 -n 1 --report-json " + cfg_link.string(), "is inside -m"},
           {" run" + model() + " --ids 1 -n 1 --trace " + dir_.string() + "/../" +
                dir_.filename().string() + "/tiktoken.model", "is inside -m"},
           {" eval" + model() + " --ids 1 --logits-out " + cfg, "is inside -m"},
           {" run" + model() + " --ids 1 -n 1 --trace " + trace_out + " --report-json " + trace_out,
            "is also given as --trace"},
           {" trace replay " + trace_out + " --ram 5x --csv " + trace_out,
            "is also given as TRACE"},
           {" trace convert " + trace_out + " " + trace_out, "is also given as IN"}}) {
    const auto bad = run_process(ktier() + args);
    EXPECT_EQ(bad.exit_code, 2) << args << ": " << bad.err;
    EXPECT_NE(bad.err.find(what), std::string::npos) << args << ": " << bad.err;
  }
  fs::remove(cfg_link);
  {
    std::ifstream in(cfg);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), cfg_before)
        << "config.json changed";
  }
  // Policies a run takes are named as such; replay's are sent there; a folder is no profile.
  for (const auto& [flag, what] : std::vector<std::pair<std::string, std::string>>{
           {" --policy lfru",
            "--policy: unknown policy 'lfru' (choose from temperature, lru, lfu or static)"},
           {" --policy all", "--policy all is for `ktier trace replay` only"},
           {" --policy belady", "--policy belady is for `ktier trace replay` only"},
           {" --profile " + dir_.string(),
            dir_.string() + ": is a directory, not a file or a pipe"}}) {
    const auto bad = run_process(ktier() + " run" + model() + " --ids 1 -n 1" + flag);
    EXPECT_EQ(bad.exit_code, 2) << flag << ": " << bad.err;
    EXPECT_NE(bad.err.find(what), std::string::npos) << flag << ": " << bad.err;
  }
  // Refused before the model loads, each naming what is wrong, no token printed: a text prompt
  // for a missing folder (the folder, not its tokenizer), a report that cannot be written (an
  // I/O error, exit 1, as for --trace and --logits-out), a prompt file that is a folder.
  for (const auto& [args, what, code] : std::vector<std::tuple<std::string, std::string, int>>{
           {" run -m /nonexistent/model -p hi", "/nonexistent/model: not a model directory", 2},
           {" run -m " + (dir_ / "config.json").string() + " -p hi",
            "config.json: not a model directory (not a directory); the model is the folder that "
            "holds it: " + dir_.string(), 2},
           {" run" + model() + " -p hi -n 2 --report-json /nonexistent/r.json",
            "--report-json: cannot write /nonexistent/r.json", 1},
           {" run" + model() + " -p hi -n 2 --report-json /proc/ktier-r.json",
            "--report-json: cannot write /proc/ktier-r.json", 2},
           {" eval" + model() + " --ids 1 --logits-out /proc/ktier-l.bin",
            "--logits-out: cannot write /proc/ktier-l.bin", 2},
           {" eval" + model() + " --ids 1 --logits-out " + dir_.parent_path().string(),
            "is a directory", 2},
           {" run" + model() + " -f " + dir_.string() + " -n 2", "is a directory", 2},
           {" run" + model() + " -f - -n 2 < " + dir_.string(), "standard input: is a directory",
            2},
           {" run" + model() + " -f /dev/zero -n 2", "/dev/zero: more than 256 MiB of text", 2},
           {" run" + model() + " -f /nonexistent/prompt.txt -n 2",
            "/nonexistent/prompt.txt: cannot open input file: No such file or directory", 2}}) {
    const auto bad = run_process(ktier() + args);
    EXPECT_EQ(bad.exit_code, code) << args << ": " << bad.err;
    EXPECT_NE(bad.err.find("ktier: error: "), std::string::npos) << args << ": " << bad.err;
    EXPECT_NE(bad.err.find(what), std::string::npos) << args << ": " << bad.err;
    EXPECT_EQ(bad.err.find("loading"), std::string::npos) << args << ": refused after the load";
    EXPECT_EQ(bad.out, "") << args;
  }
  // A prompt file there but unreadable is an I/O error (exit 1), as every other file ktier reads
  // (it was a usage error). As root, read as user nobody, whom its mode 000 refuses.
  {
    const fs::path locked = dir_.string() + "-locked-prompt.txt";
    std::ofstream(locked) << "hello\n";
    fs::permissions(locked, fs::perms::none);
    std::string as_nobody;
    if (::geteuid() == 0 && fs::exists("/usr/bin/setpriv"))
      as_nobody = "/usr/bin/setpriv --reuid 65534 --regid 65534 --clear-groups ";
    if (::geteuid() != 0 || !as_nobody.empty()) {
      const auto bad = run_process(as_nobody + ktier() + " run" + model() + " -f " +
                                   locked.string() + " -n 2");
      EXPECT_EQ(bad.exit_code, 1) << bad.err;
      EXPECT_NE(bad.err.find(locked.string() + ": cannot open input file: Permission denied"),
                std::string::npos) << bad.err;
    } else {
      std::printf("[ note ] an unreadable prompt file not tried: root without setpriv\n");
    }
    fs::remove(locked);
  }
  // A run that fails after the checks (here: a budget below the minimum) leaves an earlier
  // report as it was.
  const fs::path old_report = dir_.string() + "-old-report.json";
  std::ofstream(old_report) << "{\"old\": true}\n";
  const auto refused = run_process(ktier() + " run" + model() + " --ids 1 -n 1 --ram 1K --report-json " +
                                   old_report.string());
  EXPECT_EQ(refused.exit_code, 4) << refused.err;
  std::ifstream old_in(old_report);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(old_in), {}), "{\"old\": true}\n");
  fs::remove(old_report);
  // Options of the memory dial on a mapped checkpoint do nothing: said, not silently dropped.
  const auto mapped = run_process(ktier() + " run" + model() +
                                  " --ids 1 -n 1 --policy lru --io pread --lookahead 2");
  EXPECT_EQ(mapped.exit_code, 0) << mapped.err;
  EXPECT_NE(mapped.err.find("--policy/--profile ignored: the checkpoint is memory-mapped"),
            std::string::npos) << mapped.err;
  EXPECT_NE(mapped.err.find("--io/--io-rate-limit ignored"), std::string::npos) << mapped.err;
  EXPECT_NE(mapped.err.find("--lookahead reads nothing ahead: the checkpoint is memory-mapped"),
            std::string::npos) << mapped.err;
  const auto defaults = run_process(ktier() + " run" + model() + " --ids 1 -n 1");
  EXPECT_EQ(defaults.err.find("ignored"), std::string::npos) << "defaults: nothing to say";
  EXPECT_EQ(defaults.err.find("--lookahead"), std::string::npos) << defaults.err;
  // lm_head rows of NaN (bytes damaged): exit 3 before any token, not greedy argmax's token 0:
  // the head's matrices are checked when the engine opens (runtime/finite_trunk.h). Rows of the
  // largest finite bf16 instead (+ on row 7, - on row 8) make logits overflow to +Inf, which the
  // check of each pass's logits stops (activations, not weights: a config.json scale too large).
  const auto lm_head_rows = [&](const fs::path& dir, const std::vector<uint16_t>& rows_bits) {
    const fs::path last = dir / "model-00014-of-000014.safetensors";
    uint64_t offset = 0, hidden = 0;
    {
      auto st = format::SafetensorsFile::open(last);
      EXPECT_TRUE(st.is_ok()) << st.status().message();
      if (!st.is_ok()) return hidden;
      const format::TensorInfo* head = st->find("language_model.lm_head.weight");
      EXPECT_NE(head, nullptr);
      if (head == nullptr) return hidden;
      offset = head->file_offset;
      hidden = static_cast<uint64_t>(head->shape.at(1));
    }
    std::fstream f(last, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset + 2 * hidden * 7));  // rows 7, 8, ...
    for (const uint16_t bits : rows_bits) {
      const char bytes[2] = {static_cast<char>(bits & 0xFF), static_cast<char>(bits >> 8)};
      for (uint64_t i = 0; i < hidden; ++i) f.write(bytes, 2);
    }
    EXPECT_TRUE(f.good());
    return hidden;
  };
  {
    const fs::path nan_dir = dir_.string() + "-nan";
    fs::remove_all(nan_dir);
    fs::copy(dir_, nan_dir);
    const uint64_t hidden = lm_head_rows(nan_dir, {0x7FC0, 0x7FC0, 0x7FC0});  // quiet NaNs
    const auto r = run_process(ktier() + " run -m " + nan_dir.string() + " --ids 1,2 -n 3");
    const auto ev = run_process(ktier() + " eval -m " + nan_dir.string() + " --ids 1,2 --argmax");
    const auto ppl = run_process(ktier() + " perplexity -m " + nan_dir.string() +
                                 " --ids 1,2,3,4,5,6,7,8 -c 8");
    // Nor are logits written as if they were an answer.
    const fs::path logits = dir_.string() + "-nan.f32";
    const auto lo = run_process(ktier() + " eval -m " + nan_dir.string() + " --ids 1,2 " +
                                "--logits-out " + logits.string());
    fs::remove_all(nan_dir);
    EXPECT_FALSE(fs::exists(logits));
    const std::string where = "the head's weights (lm_head, final norm, output AttnRes) hold a "
                              "value that is not finite: language_model.lm_head.weight in "
                              "model-00014-of-000014.safetensors: element " +
                              std::to_string(7 * hidden) + " is NaN";
    for (const auto* p : {&r, &ev, &ppl, &lo}) {
      EXPECT_EQ(p->exit_code, 3) << p->err;
      EXPECT_NE(p->err.find(where), std::string::npos) << p->err;
      EXPECT_EQ(p->out, "");
    }
  }
  {
    const fs::path big_dir = dir_.string() + "-overflow";
    fs::remove_all(big_dir);
    fs::copy(dir_, big_dir);
    lm_head_rows(big_dir, {0x7F7F, 0xFF7F});  // ±3.39e38, the largest finite bf16
    // With --trace: the run stops inside a token, so the trace is left without its footer and
    // readers refuse it (closed, it would read as whole).
    const fs::path trace = dir_.string() + "-overflow.ktrace";
    const auto r = run_process(ktier() + " run -m " + big_dir.string() + " --ids 1,2 -n 3 " +
                               "--trace " + trace.string());
    const auto ev = run_process(ktier() + " eval -m " + big_dir.string() + " --ids 1,2 --argmax");
    fs::remove_all(big_dir);
    EXPECT_NE(r.err.find("trace: " + trace.string() + " left unfinished"), std::string::npos)
        << r.err;
    const auto info = run_process(ktier() + " trace info " + trace.string());
    EXPECT_EQ(info.exit_code, 3) << info.out;
    EXPECT_NE(info.err.find("without its footer"), std::string::npos) << info.err;
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("the logits after 2 positions hold +Inf (first at id 7)"),
              std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
    // The error says where: no weight is not finite, no scale of the experts last routed to
    // out of range (looked for once the logits were seen).
    const std::string why = "Every weight of the checkpoint the trunk reads is finite, and no "
                            "scale of the experts last routed to is out of range: activations "
                            "overflowed";
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
    EXPECT_EQ(ev.exit_code, 3) << ev.err;  // eval --argmax reports no id from them either
    EXPECT_NE(ev.err.find("the logits after 1 position hold +Inf"), std::string::npos) << ev.err;
    EXPECT_NE(ev.err.find(why), std::string::npos) << ev.err;
    EXPECT_EQ(ev.out, "");
  }
  // A NaN in one router row (a fuzzing find): top-k passed over that expert's NaN score and
  // the tokens changed with exit 0; now exit 3 at the first pass through the layer, naming the
  // weight (its matrices are checked before any kernel reads them).
  {
    const fs::path gate_dir = dir_.string() + "-gate";
    fs::remove_all(gate_dir);
    fs::copy(dir_, gate_dir);
    const std::string gate = "language_model.model.layers.2.block_sparse_moe.gate.weight";
    const fs::path shard = gate_dir / "model-00003-of-000014.safetensors";
    uint64_t offset = 0, hidden = 0;
    {
      auto st = format::SafetensorsFile::open(shard);
      ASSERT_TRUE(st.is_ok()) << st.status().message();
      const format::TensorInfo* t = st->find(gate);
      ASSERT_NE(t, nullptr);
      offset = t->file_offset;
      hidden = static_cast<uint64_t>(t->shape.at(1));
    }
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset + 2 * (hidden + 2)));  // expert 1's row
    const char nan_bf16[2] = {'\xc0', '\x7f'};
    f.write(nan_bf16, 2);
    f.close();
    const auto r = run_process(ktier() + " run -m " + gate_dir.string() + " --ids 1,2 -n 3");
    const auto ev = run_process(ktier() + " eval -m " + gate_dir.string() + " --ids 1,2 --argmax");
    fs::remove_all(gate_dir);
    const std::string where = "layer 2's weights hold a value that is not finite: " + gate +
                              " in model-00003-of-000014.safetensors: element " +
                              std::to_string(hidden + 2) + " is NaN";
    EXPECT_EQ(ev.exit_code, 3) << ev.err;
    EXPECT_NE(ev.err.find(where), std::string::npos) << ev.err;
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find(where), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // A NaN or infinite norm gain, bias or gate parameter: exit 3 naming the tensor and its shard,
  // even where the value would never reach the logits (the router's bias under top-k, dt_bias).
  for (const auto& [tensor, bad] :
       {std::pair<std::string, float>{"block_sparse_moe.gate.e_score_correction_bias", NAN},
        {"self_attn.dt_bias", INFINITY}, {"self_attn.dt_bias", -INFINITY}}) {
    const fs::path bad_dir = dir_.string() + "-badvec";
    fs::remove_all(bad_dir);
    fs::copy(dir_, bad_dir);
    const std::string name = "language_model.model.layers.1." + tensor;
    const fs::path shard = bad_dir / "model-00002-of-000014.safetensors";  // layer 1
    uint64_t offset = 0;
    std::string dtype;
    {
      auto st = format::SafetensorsFile::open(shard);
      ASSERT_TRUE(st.is_ok()) << st.status().message();
      const format::TensorInfo* t = st->find(name);
      ASSERT_NE(t, nullptr) << name;
      offset = t->file_offset + 3 * dtype_size(t->dtype);  // element 3
      dtype = std::string(dtype_name(t->dtype));
    }
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    if (dtype == "F32") {
      f.write(reinterpret_cast<const char*>(&bad), 4);
    } else {  // BF16: the top half of the f32
      uint32_t u;
      std::memcpy(&u, &bad, 4);
      const uint16_t h = static_cast<uint16_t>(u >> 16);
      f.write(reinterpret_cast<const char*>(&h), 2);
    }
    f.close();
    const auto r = run_process(ktier() + " run -m " + bad_dir.string() + " --ids 1,2 -n 2");
    EXPECT_EQ(r.exit_code, 3) << tensor << "\n" << r.err;
    EXPECT_NE(r.err.find(name + " in " + (bad_dir / shard.filename()).string() +
                         ": element 3 is "),
              std::string::npos)
        << r.err;
    // From a trunk pack (the same bytes, packed): the pack is named.
    const fs::path bad_pack = bad_dir.string() + "-pack";
    const auto packed = run_process(ktier() + " pack -q -m " + bad_dir.string() + " -o " +
                                    bad_pack.string() + " --force");
    EXPECT_EQ(packed.exit_code, 0) << packed.err;
    const auto from_pack = run_process(ktier() + " run -m " + bad_dir.string() + " --pack " +
                                       bad_pack.string() + " --ids 1,2 -n 2");
    fs::remove_all(bad_dir);
    fs::remove_all(bad_pack);
    EXPECT_EQ(from_pack.exit_code, 3) << from_pack.err;
    EXPECT_NE(from_pack.err.find(name + " in " + (bad_pack / "trunk.pack").string() +
                                 ": element 3 is "),
              std::string::npos)
        << from_pack.err;
  }
  // A shard cut short: corrupt input (3), named, and no token is printed.
  const fs::path cut = dir_.string() + "-cut";
  fs::remove_all(cut);
  fs::copy(dir_, cut);
  const fs::path shard = cut / "model-00003-of-000014.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  const auto r = run_process(ktier() + " run -m " + cut.string() + " --ids 1,2 -n 3");
  fs::remove_all(cut);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("model-00003-of-000014.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// A model folder's file that is a FIFO, or a folder, is refused by name at once (a FIFO's open
// used to wait forever for a writer; a folder index.json read as a file of 2^63 bytes). One that
// cannot be looked at (a symbolic link loop here; a folder without search permission alike) is
// an I/O error naming it, not "not found" (exit 2) or "does not exist" (exit 3).
TEST_F(RunEvalCli, ModelFilesThatAreNotRegularFilesAreRefusedAtOnce) {
  const fs::path copy = dir_.string() + "-notreg";
  std::string shard;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_))
    if (e.path().extension() == ".safetensors") shard = e.path().filename().string();
  for (const std::string name : {"config.json", "model.safetensors.index.json", shard.c_str(),
                                 "tiktoken.model", "tokenizer_config.json"}) {
    for (const std::string kind : {"fifo", "folder", "loop"}) {
      fs::remove_all(copy);
      fs::copy(dir_, copy);
      fs::remove(copy / name);
      if (kind == "fifo") {
        ASSERT_EQ(::mkfifo((copy / name).c_str(), 0644), 0);
      } else if (kind == "folder") {
        fs::create_directory(copy / name);
      } else {
        fs::create_symlink(name, copy / name);
      }
      const auto r = run_process("timeout 60 " + ktier() + " run -m " + copy.string() +
                                 " -p hi -n 1");
      const std::string path = (copy / name).string();
      if (kind == "loop") {
        EXPECT_EQ(r.exit_code, 1) << name << ": " << r.err;
        EXPECT_NE(r.err.find(path + ": cannot access: "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("(ELOOP)"), std::string::npos) << r.err;
        continue;
      }
      EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err;
      EXPECT_NE(r.err.find(path + ": is " + (kind == "fifo" ? "a FIFO (named pipe)" : "a directory") +
                           ", not a regular file"),
                std::string::npos)
          << r.err;
    }
  }
  fs::remove_all(copy);
}

// A reader that goes away (`| head -c 1`): exit 1 naming the broken pipe, the trace closed at a
// whole token (before, SIGPIPE ended the run: exit 141, no message, a trace of 0 bytes).
TEST_F(RunEvalCli, BrokenPipeIsAWriteErrorAndTheTraceIsKept) {
  const fs::path trace = dir_.string() + "-pipe.ktrace";
  const auto r = run_process("( { " + ktier() + " run" + model() +
                             " --ids 1,2,3 -n 2000 --temp 1 --seed 5 --trace " + trace.string() +
                             "; echo \"rc=$?\" >&2; } | head -c 1 )");
  EXPECT_NE(r.err.find("rc=1\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error writing standard output: Broken pipe (EPIPE)"), std::string::npos)
      << r.err;
  const auto info = run_process(ktier() + " trace info " + trace.string());
  EXPECT_EQ(info.exit_code, 0) << info.err;
}

// `tokenize` flags of the other direction are refused, not ignored (--decode without --ids
// printed an empty line with exit 0).
TEST_F(RunEvalCli, TokenizeRefusesFlagsOfTheOtherDirection) {
  const std::string tokenize = ktier() + " tokenize --tokenizer " + dir_.string();
  for (const auto& [args, what] : std::vector<std::pair<std::string, std::string>>{
           {" --decode", "--decode requires --ids"},
           {" --decode --ids 1 --special", "--special excludes --decode"},
           {" --decode --ids 1 --pattern o200k", "--pattern excludes --decode"},
           {" -p hi --skip-special", "--skip-special requires --decode"},
           {" -p hi --ids 1", "--ids needs --decode"},
           {" --decode --ids ''", "--ids is empty"},
           // A tiktoken.model on its own has no added tokens: --special read nothing (exit 0).
           {"/tiktoken.model -p 'a<|end_of_msg|>b' --special", "has no added tokens to read"}}) {
    const auto r = run_process(tokenize + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_EQ(run_process(tokenize + " --decode --ids 104,105 --skip-special").exit_code, 0);
}

// A tokenizer with fewer ids than config.json's vocab_size: the ids past it have no text, which
// the run says once instead of dropping them silently.
TEST_F(RunEvalCli, TokenizerSmallerThanTheModelVocabularyIsWarned) {
  const fs::path copy = dir_.string() + "-vocab";
  fs::remove_all(copy);
  fs::copy(dir_, copy);
  std::ofstream(copy / "tokenizer_config.json") << R"({"added_tokens_decoder": {}})";
  const auto r = run_process(ktier() + " run -m " + copy.string() + " -p hi -n 1");
  fs::remove_all(copy);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("config.json's vocab_size is 320: generated ids past the tokenizer print "
                       "no text"),
            std::string::npos)
      << r.err;
  const auto same = run_process(ktier() + " run" + model() + " -p hi -n 1");
  EXPECT_EQ(same.err.find("vocab_size is"), std::string::npos) << same.err;
}

}  // namespace
}  // namespace ktier::test
