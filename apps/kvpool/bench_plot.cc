#include "bench_plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

extern char** environ;

namespace kvp::app {
namespace {

namespace fs = std::filesystem;

// A string as a gnuplot double-quoted literal.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The script: one inline data block per run and panel, then the two plots.
std::string make_script(std::span<const PlotRun> runs, const std::string& title,
                        const std::string& png_path) {
  std::ostringstream s;
  for (size_t r = 0; r < runs.size(); ++r) {
    // cumulative output tokens at each token's wall time
    std::vector<double> times;
    for (const RequestTiming& t : runs[r].report->requests) {
      times.insert(times.end(), t.token_times_s.begin(), t.token_times_s.end());
    }
    std::sort(times.begin(), times.end());
    s << "$tokens" << r << " << EOD\n0 0\n";
    for (size_t i = 0; i < times.size(); ++i) s << fmt::format("{:.6f} {}\n", times[i], i + 1);
    s << "EOD\n";
    s << "$ttft" << r << " << EOD\n";
    for (const RequestTiming& t : runs[r].report->requests) {
      if (t.token_times_s.empty()) continue;  // finished without a token (cancelled)
      s << fmt::format("{:.6f} {:.6f}\n", t.arrival_s, (t.first_token_s - t.arrival_s) * 1e3);
    }
    s << "EOD\n";
  }
  s << "set terminal pngcairo size 1400,520 font 'sans,10'\n";
  s << "set output " << quoted(png_path) << "\n";
  s << "set multiplot layout 1,2 title " << quoted(title) << "\n";
  s << "set key left top\nset grid\n";
  s << "set xlabel 'wall time (s)'\nset ylabel 'output tokens generated'\n";
  s << "set title 'Throughput: output tokens over time'\n";
  s << "plot ";
  for (size_t r = 0; r < runs.size(); ++r) {
    s << (r ? ", " : "") << "$tokens" << r << " using 1:2 with steps lw 2 title "
      << quoted(runs[r].label);
  }
  s << "\nset xlabel 'request arrival (s)'\nset ylabel 'time to first token (ms)'\n";
  s << "set title 'Time to first token per request'\n";
  s << "plot ";
  for (size_t r = 0; r < runs.size(); ++r) {
    s << (r ? ", " : "") << "$ttft" << r << " using 1:2 with points pt 7 ps 0.8 title "
      << quoted(runs[r].label);
  }
  s << "\nunset multiplot\n";
  return s.str();
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Status write_bench_plot(std::span<const PlotRun> runs, const std::string& title,
                        const std::string& png_path) {
  if (runs.empty()) return Status::invalid_argument("--plot {}: no runs to draw", png_path);
  for (const PlotRun& run : runs) {
    if (run.report == nullptr || run.report->requests.empty()) {
      return Status::invalid_argument("--plot {}: run '{}' has no requests", png_path, run.label);
    }
  }
  const fs::path out(png_path);
  const fs::path folder = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    return Status::not_found("--plot {}: folder {} does not exist", png_path, folder.string());
  }
  // gnuplot reads the script from a file; its stderr goes to another, both beside the output.
  const fs::path script_path = fs::path(png_path + ".gnuplot");
  const fs::path errors_path = fs::path(png_path + ".gnuplot-errors");
  {
    std::ofstream script(script_path);
    script << make_script(runs, title, png_path);
    if (!script)
      return Status::io_error("--plot {}: cannot write {}", png_path, script_path.string());
  }
  fs::remove(out, ec);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errors_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::string program = "gnuplot";
  std::string script_arg = script_path.string();
  char* argv[] = {program.data(), script_arg.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  Status status = Status::ok();
  if (spawned != 0) {
    // the script stays, so the picture can be drawn where gnuplot is (a GPU machine has none)
    fs::remove(errors_path, ec);
    return Status::not_found(
        "--plot {}: cannot run gnuplot ({}); scripts/setup.sh installs it (gnuplot-nox); the "
        "script is kept in {}: `gnuplot {}` draws the picture",
        png_path, std::strerror(spawned), script_path.string(), script_path.string());
  } else {
    int wait_status = 0;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    const std::string errors = read_all(errors_path);
    if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0 || !fs::exists(out, ec)) {
      status = Status::internal("--plot {}: gnuplot failed: {}", png_path,
                                errors.empty() ? "no message" : errors);
      fs::remove(out, ec);
    }
  }
  fs::remove(script_path, ec);
  fs::remove(errors_path, ec);
  return status;
}

}  // namespace kvp::app
