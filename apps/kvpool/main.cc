// The kvpool command: one subcommand per job (generate, chat, serve, inspect, bench, plan,
// perplexity). Exit codes: 0 success, 2 bad usage or bad input (unknown option, unreadable file),
// anything else a failure of the run.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <utility>

#include "bench_cmd.h"
#include "chat.h"
#include "generate.h"
#include "perplexity_cmd.h"
#include "plan.h"
#include "serve.h"

int main(int argc, char** argv) {
  CLI::App app{"kvpool: a paged KV-cache block pool inference engine"};
  app.require_subcommand(1);
  kvp::app::GenerateOptions generate_options;
  CLI::App* generate = kvp::app::add_generate_command(app, &generate_options);
  kvp::app::InspectOptions inspect_options;
  CLI::App* inspect = kvp::app::add_inspect_command(app, &inspect_options);
  kvp::app::BenchOptions bench_options;
  CLI::App* bench = kvp::app::add_bench_command(app, &bench_options);
  kvp::app::ChatOptions chat_options;
  CLI::App* chat = kvp::app::add_chat_command(app, &chat_options);
  kvp::app::ServeOptions serve_options;
  CLI::App* serve = kvp::app::add_serve_command(app, &serve_options);
  kvp::app::PlanOptions plan_options;
  CLI::App* plan = kvp::app::add_plan_command(app, &plan_options);
  kvp::app::PerplexityOptions perplexity_options;
  CLI::App* perplexity = kvp::app::add_perplexity_command(app, &perplexity_options);
  auto is_command = [&](const char* name) {
    return !app.get_subcommands([&](CLI::App* sub) { return sub->check_name(name); }).empty();
  };
  if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
    std::fprintf(stderr,
                 "kvpool: unknown command '%s' (commands: generate, chat, serve, inspect, bench, "
                 "plan, perplexity; see kvpool --help)\n",
                 argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help (code 0) or the error and usage
    return code == 0 ? 0 : 2;
  }
  if (generate->parsed()) return kvp::app::run_generate(generate_options);
  if (inspect->parsed()) return kvp::app::run_inspect(inspect_options);
  if (bench->parsed()) return kvp::app::run_bench_command(std::move(bench_options));
  if (plan->parsed()) return kvp::app::run_plan(plan_options);
  if (serve->parsed()) return kvp::app::run_serve(serve_options);
  if (chat->parsed()) return kvp::app::run_chat(chat_options);
  if (perplexity->parsed()) return kvp::app::run_perplexity(perplexity_options);
  return 2;
}
