// `kvpool bench --plot FILE.png`: one picture of one or more benchmark runs, drawn by gnuplot
// (Debian's gnuplot-nox, installed by scripts/setup.sh; run as a child process, fed a script on
// its standard input). Two panels side by side:
//   left:  output tokens generated so far against wall time, one line per run: the slope is the
//          throughput, and ramp-up, steady state and drain show as the bends of the curve;
//   right: each request's time to first token against its arrival, one point series per run:
//          with --compare-sessions, sessions (only new tokens prefilled) against re-prefill
//          (the whole history every turn) turn by turn.
#pragma once

#include <span>
#include <string>

#include "common/status.h"
#include "engine/bench.h"

namespace kvp::app {

struct PlotRun {
  std::string label;  // legend entry
  const BenchReport* report = nullptr;
};

// Writes the PNG. Errors: no runs or a run with no requests → invalid_argument; the folder of
// png_path missing → not_found; gnuplot not installed → not_found, and its script is kept in
// png_path + ".gnuplot" to be drawn elsewhere; gnuplot failing → internal with gnuplot's own
// message. The PNG exists only if gnuplot succeeded.
Status write_bench_plot(std::span<const PlotRun> runs, const std::string& title,
                        const std::string& png_path);

}  // namespace kvp::app
