// ktier tokenize: encode text to ids or decode ids to text with a K3 (or o200k) tokenizer.
//
//   ktier tokenize --tokenizer DIR (-p TEXT | -f FILE) [--special] [--pattern k3|o200k]
//       prints the ids on one line, comma-separated ("19180,2695"; empty line for empty text)
//   ktier tokenize --tokenizer DIR --decode --ids 1,2,3 [--skip-special]
//       prints the decoded bytes exactly, followed by one newline
//
// DIR holds tiktoken.model and tokenizer_config.json; a bare tiktoken.model file is accepted
// too (no added tokens). -f - reads standard input. Exit codes: 2 usage (bad options, missing
// files, unknown ids), 3 corrupt tokenizer files, 1 I/O failure.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace ktier::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string file;
  std::string ids;
  std::string pattern = "k3";
  bool special = false;
  bool decode = false;
  bool skip_special = false;
  bool has_text = false;
};

Status run_tokenize(const TokenizeArgs& a) {
  KTIER_ASSIGN_OR_RETURN(const tok::SplitPattern pattern, tok::parse_pattern(a.pattern));
  if (a.decode) {
    if (a.has_text || !a.file.empty()) return Status::usage("--decode takes --ids, not -p or -f");
    KTIER_RETURN_IF_ERROR(check_ids_given(a.ids));
  } else {
    if (!a.ids.empty()) return Status::usage("--ids needs --decode");
    if (a.has_text == !a.file.empty()) return Status::usage("give exactly one of -p TEXT or -f FILE");
  }
  KTIER_ASSIGN_OR_RETURN(const tok::Tokenizer t, tok::Tokenizer::load(a.tokenizer, pattern));
  if (a.special && t.vocab_size() == t.n_ranks())
    return Status::usage("--special: " + a.tokenizer +
                         " has no added tokens to read (a tiktoken.model on its own lists none; "
                         "give the folder with tokenizer_config.json)");
  if (a.decode) {
    KTIER_ASSIGN_OR_RETURN(const std::vector<uint32_t> ids, parse_ids(a.ids));
    KTIER_ASSIGN_OR_RETURN(const std::string text, t.decode(ids, a.skip_special));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    std::string input;
    if (a.has_text) {
      input = a.text;
    } else {
      KTIER_ASSIGN_OR_RETURN(input, read_input(a.file));
    }
    const std::vector<uint32_t> ids = t.encode(input, a.special);
    std::string line;
    line.reserve(ids.size() * 7);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ',';
      line += std::to_string(ids[i]);
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
  }
  if (std::fflush(stdout) != 0) return Status::runtime("error writing standard output");
  return Status::ok();
}

}  // namespace

void register_tokenize_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* sub = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  sub->add_option("--tokenizer", args->tokenizer,
                  "Folder with tiktoken.model and tokenizer_config.json (or a tiktoken.model file)")
      ->required();
  auto* p = sub->add_option("-p,--prompt", args->text, "Text to encode");
  auto* f = sub->add_option("-f,--file", args->file,
                            "File to encode byte for byte ('-' for standard input); `run -f` "
                            "drops one final newline first, as llama.cpp's -f");
  p->excludes(f);
  auto* special = sub->add_flag(
      "--special", args->special,
      "Encode added-token strings in the input as their ids (trusted text only), as `run "
      "-p` and serve's completions read a prompt");
  auto* pattern = sub->add_option("--pattern", args->pattern,
                                  "Split pattern: k3 (default) or o200k (OpenAI's, for "
                                  "cross-checks); encoding only")
                      ->capture_default_str();
  // Flags of the other direction are refused rather than ignored.
  auto* decode = sub->add_flag("--decode", args->decode, "Decode --ids instead of encoding");
  auto* ids = sub->add_option("--ids", args->ids, "Comma-separated token ids to decode");
  decode->needs(ids);
  special->excludes(decode);
  pattern->excludes(decode);  // decoding splits nothing
  sub->add_flag("--skip-special", args->skip_special,
                "When decoding, drop added tokens flagged special")
      ->needs(decode);
  sub->callback([args, p, &exit_code] {
    args->has_text = p->count() > 0;
    exit_code = finish(run_tokenize(*args));
  });
}

}  // namespace ktier::cli
