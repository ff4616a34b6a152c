// framework/distributed.h - where this process sits among the ranks of a run, and the local
// launcher (`qrun --nproc-per-node N ...`).
//
// The conventions people already launch with are read, never invented: torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and SLURM's
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE, the
// first host of SLURM_JOB_NODELIST; MASTER_PORT or 29500). A launch that is inconsistent (WORLD_SIZE
// without RANK, a rank outside the world, a port that is no port) is a UserError naming the
// variables and their values.
#pragma once

#include <qrun/sdk/run.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace qrun {

// The launch environment from `vars` (the process environment when empty is not wanted: pass
// environ_map()). Single process when none of the variables is set.
DistributedEnv read_launch_env(const std::map<std::string, std::string>& vars);
std::map<std::string, std::string> environ_map();

// A TCP port nobody listens on now (the kernel picks it).
int free_tcp_port();

// The first host of a SLURM node list: "gpu[03-05,07],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);

// Runs `nproc` copies of this binary with `args` on this node as ranks 0..nproc-1 of one run
// (torchrun's variables set; MASTER_ADDR 127.0.0.1 and a free MASTER_PORT unless set). SIGINT
// and SIGTERM are forwarded to every rank. When a rank exits with an error (or a signal), the
// others get SIGTERM, then SIGKILL after `grace_s` seconds, and the launcher reports which rank
// failed first and how. Returns the first failing rank's exit code (0 when all succeed).
int launch_local(int nproc, const std::vector<std::string>& args, double grace_s = 20.0);

}  // namespace qrun
