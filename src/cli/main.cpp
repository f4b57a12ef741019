// ktier: one binary, subcommands in src/cli/cmd_*.cpp.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <new>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "common/debug_env.h"
#include "common/log.h"
#include "ktier/version.h"

namespace ktier::cli {

int finish(const Status& status) {
  if (!status.is_ok())
    std::fprintf(stderr, "ktier: %s%s\n", status.code() == ExitCode::kInterrupted ? "" : "error: ",
                 status.message().c_str());
  return status.exit_code();
}

// The options given before a command that ktier itself takes, as the app lists them.
std::string own_options(const CLI::App& app) {
  std::string text;
  for (const CLI::Option* o : app.get_options()) {
    const std::vector<std::string>& longs = o->get_lnames();
    if (longs.empty()) continue;
    text += (text.empty() ? "--" : ", --") + longs.front();
  }
  return text;
}

}  // namespace ktier::cli

int main(int argc, char** argv) {
  using namespace ktier;
  // A closed standard descriptor would be handed to the next open(): a shard read as the chat's
  // input, a log line written into a file. Each closed one is taken by /dev/null first (open()
  // takes the lowest free number, so they are reopened in order), read-only: reads see end of
  // input and writes fail (EBADF), so output to a closed stdout is still reported as lost.
  for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF && ::open("/dev/null", O_RDONLY) < 0)
      return static_cast<int>(ExitCode::kRuntime);
  CLI::App app{
      "ktier: decodes Kimi K3 on one machine. The CPU path is exact and the reference;\n"
      "a GPU, when present, holds hot experts. Exit codes: 0 ok, 1 runtime/I-O, 2 usage/config,\n"
      "3 corrupt input, 4 budget cannot be met, 130 run or perplexity stopped by Ctrl-C\n"
      "(serve exits 0 on Ctrl-C or SIGTERM once loaded). Global: --log-level.",
      "ktier"};
  app.set_version_flag("--version", std::string("ktier ") + kVersion + " (" + kGitRevision + ")");
  // An option given twice takes its last value, as llama.cpp's do (scripts append overrides);
  // subcommands inherit the default.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.require_subcommand(1);
  app.fallthrough();

  int exit_code = 0;
  cli::register_run_command(app, exit_code);
  cli::register_eval_command(app, exit_code);
  cli::register_perplexity_command(app, exit_code);
  cli::register_synth_command(app, exit_code);
  cli::register_inspect_command(app, exit_code);
  cli::register_tokenize_command(app, exit_code);
  cli::register_doctor_command(app, exit_code);
  cli::register_trace_command(app, exit_code);
  cli::register_bench_command(app, exit_code);
  cli::register_pack_command(app, exit_code);
  cli::register_plan_command(app, exit_code);
#if KTIER_HAS_SERVER
  cli::register_serve_command(app, exit_code);
#endif

  cli::read_numbers_as_written(app);

  // CLI11 reads an empty value as the type's zero ("-n ''" as -n 0, "--pack=" as no pack). Only
  // text and id lists mean something by an empty value (an empty prompt to tokenize); for every
  // other option it is refused by name, before any command runs.
  const auto display_name = [](const CLI::Option& opt) {  // "--pack", "-n" or "IN"
    if (!opt.get_lnames().empty()) return "--" + opt.get_lnames().front();
    if (!opt.get_snames().empty()) return "-" + opt.get_snames().front();
    return opt.get_name(true);
  };
  std::function<void(const CLI::App*)> refuse_empty_values = [&](const CLI::App* cmd) {
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->check_lname("prompt") || opt->check_lname("ids") || opt->check_lname("pattern"))
        continue;
      for (const std::string& value : opt->results())
        if (value.empty())
          throw CLI::ValidationError(display_name(*opt) +
                                     ": empty value (give one, or leave the option out)");
    }
    for (const CLI::App* sub : cmd->get_subcommands()) refuse_empty_values(sub);  // parsed ones
  };
  // Runs before any subcommand callback: the log level is set and empty values refused first.
  app.parse_complete_callback([&] {
    const Status s = set_log_level(log_level);
    if (!s.is_ok()) throw CLI::ValidationError(s.message());
    refuse_empty_values(&app);
  });

  // Whether `cmd` or one of its commands has an option named `name` for which `pred` holds
  // (names are unique within a command; the app's own are --help, --version and --log-level).
  using OptionTest = std::function<bool(const CLI::Option&)>;
  std::function<bool(const CLI::App*, const std::string&, const OptionTest&)> any_option =
      [&](const CLI::App* cmd, const std::string& name, const OptionTest& pred) {
        for (const CLI::Option* opt : cmd->get_options())
          if (opt->check_name(name) && pred(*opt)) return true;
        for (const CLI::App* sub : cmd->get_subcommands({}))
          if (any_option(sub, name, pred)) return true;
        return false;
      };
  // Whether some command's option of that name reads a value (a flag does not).
  const auto takes_value = [&](std::string_view name) {
    return any_option(&app, std::string(name),
                      [](const CLI::Option& o) { return o.get_items_expected_min() > 0; });
  };
  // The delimiter of some command's option of that name that reads a list ('\0': none).
  const auto delimiter_of = [&](std::string_view name) {
    char delimiter = '\0';
    any_option(&app, std::string(name), [&](const CLI::Option& o) {
      delimiter = o.get_delimiter();
      return delimiter != '\0';
    });
    return delimiter;
  };
  for (const std::string& problem :
       {cli::llama_cpp_flag_problem(argc, argv, takes_value),
        cli::empty_list_value_problem(argc, argv, takes_value, delimiter_of)}) {
    if (problem.empty()) continue;
    std::fprintf(stderr, "ktier: error: %s\n", problem.c_str());
    return static_cast<int>(ExitCode::kUsage);
  }
  // Before any command: a bad debugging variable is a usage error naming it.
  if (const Result<DebugEnv>& env = debug_env(); !env.is_ok()) return cli::finish(env.status());
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line in the form of every other error, then where to look.
    std::string what = e.what();
    // A word where a command was due ("ktier bogus", "ktier trace bogus") is named, with the
    // choices, instead of CLI11's "A subcommand is required".
    const CLI::App* level = &app;
    std::string path = "";
    const auto names = [](const std::vector<const CLI::App*>& subs) {
      std::string text;
      for (const CLI::App* sub : subs) text += (text.empty() ? "" : ", ") + sub->get_name();
      return text;
    };
    bool named = false;
    for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
      const auto subs = level->get_subcommands({});
      if (subs.empty()) break;  // a positional argument of a leaf command
      const auto next = std::find_if(subs.begin(), subs.end(), [&](const CLI::App* sub) {
        return sub->get_name() == argv[i];
      });
      if (next == subs.end()) {
        what = "unknown " + path + "command '" + argv[i] + "' (choose from " + names(subs) + ")";
        named = true;
        break;
      }
      level = *next;
      path += level->get_name() + " ";
    }
    const auto subs = level->get_subcommands({});
    // An option before any command that ktier does not know ("ktier --bogus"): named, rather
    // than "needs a command".
    std::string unknown_global;
    for (int i = 1; i < argc && argv[i][0] == '-' && level == &app; ++i) {
      const std::string arg = argv[i], name = arg.substr(0, arg.find('='));
      const CLI::Option* own = app.get_option_no_throw(name);
      if (own == nullptr) {
        unknown_global = arg;
        break;
      }
      if (name == arg && own->get_items_expected_min() > 0) ++i;  // its value
    }
    if (!named && !subs.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
        level->get_require_subcommand_min() > 0)
      what = !unknown_global.empty()
                 ? "unknown option '" + unknown_global + "' before the command (ktier's own: " +
                       cli::own_options(app) + "; a command's options go after it)"
                 : (path.empty() ? std::string("ktier ") : path) + "needs a command: " +
                       names(subs);
    std::fprintf(stderr, "ktier: error: %s\nRun 'ktier --help' or 'ktier COMMAND --help'.\n",
                 what.c_str());
    return static_cast<int>(ExitCode::kUsage);
  } catch (const std::bad_alloc&) {
    // Memory outside the budgets (which size what they govern before allocating it) that the
    // system refused: say so in words, not as "std::bad_alloc".
    std::fprintf(stderr, "ktier: error: out of memory: the system refused an allocation (one "
                         "outside the --ram budget of commands that have one; see "
                         "docs/TUNING.md)\n");
    return static_cast<int>(ExitCode::kRuntime);
  } catch (const std::filesystem::filesystem_error& e) {  // a std::system_error too
    std::fprintf(stderr, "ktier: error: %s\n", e.what());
    return static_cast<int>(ExitCode::kRuntime);
  } catch (const std::system_error& e) {
    // What else the environment refused below a Status, most often a thread the system would
    // not start: an error, not std::terminate, and one that says where to look.
    const bool thread_limit = e.code() == std::errc::resource_unavailable_try_again;
    std::fprintf(stderr, "ktier: error: the system refused a resource: %s%s\n", e.what(),
                 thread_limit ? " (a thread or process limit: ulimit -u, a container's pids.max)"
                              : "");
    return static_cast<int>(ExitCode::kRuntime);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ktier: error: %s\n", e.what());
    return static_cast<int>(ExitCode::kRuntime);
  }
  // Every command's stdout: what a full disk or a closed descriptor refused is an error, not a
  // silent exit 0 (doctor, inspect, trace info, bench ... print through stdio).
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    if (exit_code == 0) {
      std::fprintf(stderr, "ktier: error: error writing standard output\n");
      return static_cast<int>(ExitCode::kRuntime);
    }
  }
  if (exit_code == static_cast<int>(ExitCode::kInterrupted)) {
    // Stopped by Ctrl-C after a clean finish (common/interrupt.h): end by SIGINT itself, so that
    // a shell running ktier in a script or loop stops too (it goes on after a plain exit 130,
    // taking that as a child that handled the Ctrl-C). 130 if SIGINT is blocked.
    std::fflush(stderr);
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
  return exit_code;
}
