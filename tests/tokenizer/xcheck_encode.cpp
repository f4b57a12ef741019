// Test-only driver for tools/tokenizer/xcheck.py (the js-tiktoken cross-check).
//
//   tokenizer_xcheck_encode --tokenizer DIR --pattern k3|o200k --corpus CORPUS.jsonl --out OUT.jsonl
//                           [--max-chunk N --max-run N]
//       encodes each document ({"name","text"} per line) and writes {"name","ids"} per line;
//       prints {"documents","bytes","ids","seconds","mb_per_s","cpu_seconds","mb_per_cpu_s"}
//       (encode time only, one thread; wall clock and thread CPU time).
//   tokenizer_xcheck_encode --dump-classes OUT.txt
//       writes ktier's Unicode class table as run-length lines "FIRST_HEX BITS" (all bits of
//       unicode_tables.h), for comparison with V8 and Python.
// Exit codes: 0 ok, 2 usage, otherwise the tokenizer Status code.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

int fail(const ktier::Status& s) {
  std::fprintf(stderr, "tokenizer_xcheck_encode: %s\n", s.message().c_str());
  return s.exit_code();
}

int dump_classes(const char* path) {
  std::FILE* f = std::fopen(path, "w");
  if (!f) return fail(ktier::Status::runtime(std::string(path) + ": cannot write"));
  std::fprintf(f, "# ktier unicode %s\n", ktier::tok::kUnicodeVersion);
  int prev = -1;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const int bits = ktier::tok::cp_bits(cp);
    if (bits != prev) std::fprintf(f, "%x %d\n", cp, bits);
    prev = bits;
  }
  return std::fclose(f) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, pattern_name = "k3", corpus, out;
  ktier::tok::ChunkLimits limits;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--dump-classes" && v) return dump_classes(v);
    if (!v) return fail(ktier::Status::usage("missing value after " + a));
    if (a == "--tokenizer") dir = v;
    else if (a == "--pattern") pattern_name = v;
    else if (a == "--corpus") corpus = v;
    else if (a == "--out") out = v;
    else if (a == "--max-chunk") limits.max_chunk_chars = std::stoul(v);
    else if (a == "--max-run") limits.max_run_chars = std::stoul(v);
    else return fail(ktier::Status::usage("unknown option " + a));
    ++i;
  }
  if (dir.empty() || corpus.empty() || out.empty()) {
    return fail(ktier::Status::usage("need --tokenizer, --corpus and --out"));
  }
  auto pattern = ktier::tok::parse_pattern(pattern_name);
  if (!pattern.is_ok()) return fail(pattern.status());
  auto tok = ktier::tok::Tokenizer::load(dir, *pattern);
  if (!tok.is_ok()) return fail(tok.status());

  std::ifstream in(corpus, std::ios::binary);
  if (!in) return fail(ktier::Status::usage(corpus + ": cannot open"));
  std::vector<std::pair<std::string, std::string>> docs;
  std::string line;
  size_t bytes = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("name") || !j.contains("text")) {
      return fail(ktier::Status::corrupt(corpus + ": bad line " + std::to_string(docs.size() + 1)));
    }
    docs.emplace_back(j["name"].get<std::string>(), j["text"].get<std::string>());
    bytes += docs.back().second.size();
  }
  std::vector<std::vector<uint32_t>> ids(docs.size());
  // Wall time, and this thread's CPU time (the honest figure on a shared, busy machine).
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double c0 = cpu_now();
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t d = 0; d < docs.size(); ++d) ids[d] = tok->encode_with_limits(docs[d].second, false, limits);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_secs = cpu_now() - c0;

  std::ofstream o(out, std::ios::binary);
  size_t n_ids = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    o << nlohmann::json{{"name", docs[d].first}, {"ids", ids[d]}}.dump() << "\n";
    n_ids += ids[d].size();
  }
  if (!o) return fail(ktier::Status::runtime(out + ": write error"));
  std::cout << nlohmann::json{{"documents", docs.size()}, {"bytes", bytes}, {"ids", n_ids},
                              {"seconds", secs}, {"mb_per_s", bytes / 1e6 / secs},
                              {"cpu_seconds", cpu_secs}, {"mb_per_cpu_s", bytes / 1e6 / cpu_secs}}.dump()
            << std::endl;
  return 0;
}
