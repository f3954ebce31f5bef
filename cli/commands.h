// The `stowage` subcommands. Each lives in its own file and returns the process exit code:
// 0 success, 1 the request cannot be met (e.g. a plan does not fit), 2 bad usage or input,
// 3 the machine lacks what the command needs (e.g. no GPU).
#ifndef STOWAGE_CLI_COMMANDS_H_
#define STOWAGE_CLI_COMMANDS_H_

namespace stowage::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUnmet = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnavailable = 3;

// argv[0] is the subcommand name; flags follow.
int RunPlanCommand(int argc, char** argv);         // plan_command.cc
int RunSearchCommand(int argc, char** argv);       // search_command.cc
int RunCalibrateCommand(int argc, char** argv);    // calibrate_command.cc
int RunBenchCommand(int argc, char** argv);        // bench_command.cc
int RunDemoRuntimeCommand(int argc, char** argv);  // demo_runtime_command.cc

}  // namespace stowage::tools

#endif  // STOWAGE_CLI_COMMANDS_H_
