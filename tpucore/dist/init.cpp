// The default group: init_process_group from options or the environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, as torch.distributed), new_group, DeviceMesh, and the free functions.
#include <unistd.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "tpucore/dist/backend.h"

namespace tpu::dist {

namespace {

struct World {
  std::mutex mu;
  ProcessGroupPtr group;
  std::shared_ptr<Backend> backend;
  int rank = -1, size = 0, next_group_id = 0;
  std::chrono::milliseconds timeout{0};
  bool check = true;
  std::vector<ProcessGroupPtr> sim_groups;  // backend "sim": rank r's default group (rank threads)
  int sim_runs = 0;                         // run_ranks calls so far (new_group ids of each run differ)
};

// On a rank thread of run_ranks: its rank, and its run's new_group ids (negative, so they never
// meet sim_new_group's).
thread_local int t_sim_rank = -1;
thread_local int t_group_base = 0;
thread_local int t_next_group = 0;

World& world_state() {
  static World w;
  return w;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

int env_int(const char* name, const char* hint) {
  std::string v = env(name);
  if (v.empty()) fail("tpu::dist::init_process_group: ${} is not set ({})", name, hint);
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    fail("tpu::dist::init_process_group: ${}='{}' is not an integer", name, v);
  }
}

const char* kLaunchHint = "start the ranks with tools/tpu-run, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

}  // namespace

void init_process_group(const InitOptions& o) {
  World& w = world_state();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.group || !w.sim_groups.empty())
    fail("tpu::dist::init_process_group: already initialized ({} backend, world size {}); call destroy_process_group first",
         w.group ? w.group->backend_name() : "sim", w.size);
  if (o.backend == "sim") {
    if (o.rank >= 0)
      fail("tpu::dist::init_process_group: the sim backend runs every rank in this process; leave rank at -1 and "
           "start the ranks with tpu::dist::run_ranks");
    if (o.world_size == 0 || o.world_size < -1)
      fail("tpu::dist::init_process_group: world size {} must be at least 1 (-1: every chip of the pod)", o.world_size);
    SimPodOptions so;
    so.chips = o.world_size > 0 ? o.world_size : 0;
    so.timeout = o.timeout;
    so.check_consistency = o.check_consistency;
    w.sim_groups = sim_pod_groups(so);  // checks the pod and the chip count
    w.size = static_cast<int>(w.sim_groups.size());
    w.rank = -1;
    w.timeout = w.sim_groups[0]->timeout();
    w.check = o.check_consistency && env("TPU_DIST_CHECK") != "0";
    return;
  }
  int rank = o.rank >= 0 ? o.rank : env_int("RANK", kLaunchHint);
  int size = o.world_size >= 0 ? o.world_size : env_int("WORLD_SIZE", kLaunchHint);
  if (size < 1) fail("tpu::dist::init_process_group: world size {} must be at least 1", size);
  if (rank < 0 || rank >= size) fail("tpu::dist::init_process_group: rank {} is outside 0..{} (world size {})", rank, size - 1, size);
  auto timeout = o.timeout;
  if (timeout.count() <= 0) {
    std::string t = env("TPU_DIST_TIMEOUT_MS");
    timeout = std::chrono::milliseconds(t.empty() ? 30000 : std::max(1, std::atoi(t.c_str())));
  }
  bool check = o.check_consistency && env("TPU_DIST_CHECK") != "0";
  std::string method = !o.init_method.empty() ? o.init_method : env("TPU_DIST_INIT_METHOD");
  if (method.empty()) method = "env://";
  std::string host = o.hostname.empty() ? env("TPU_DIST_HOSTNAME") : o.hostname;
  std::string spec = method;
  if (method == "env://") {
    std::string addr = env("MASTER_ADDR");
    if (addr.empty()) fail("tpu::dist::init_process_group: $MASTER_ADDR is not set ({})", kLaunchHint);
    spec = fmt::format("tcp://{}:{}", addr, env_int("MASTER_PORT", kLaunchHint));
  }
  if (host.empty()) {
    bool loopback = spec.rfind("file://", 0) == 0 || spec.find("://127.") != std::string::npos ||
                    spec.find("://localhost:") != std::string::npos;
    char name[256] = {};
    if (!loopback && ::gethostname(name, sizeof(name) - 1) == 0) host = name;
    else host = "127.0.0.1";
  }
  std::shared_ptr<Backend> backend;
  if (o.backend == "gloo") backend = make_gloo_world(rank, size, spec, host, timeout);
  else fail("tpu::dist::init_process_group: unknown backend '{}' (available: gloo, sim)", o.backend);
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) ranks[static_cast<size_t>(i)] = i;
  w.group = std::make_shared<ProcessGroup>(backend, ranks, rank, timeout, check);
  w.backend = backend;
  w.rank = rank;
  w.size = size;
  w.next_group_id = 0;
  w.timeout = timeout;
  w.check = check;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(world_state().mu);
  return world_state().group != nullptr || !world_state().sim_groups.empty();
}

void destroy_process_group() {
  World& w = world_state();
  ProcessGroupPtr g;
  std::shared_ptr<Backend> b;
  std::vector<ProcessGroupPtr> sims;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (t_sim_rank >= 0) fail("tpu::dist::destroy_process_group: called on rank {}'s thread inside run_ranks; call it after run_ranks returns", t_sim_rank);
    g = std::move(w.group);
    b = std::move(w.backend);
    sims = std::move(w.sim_groups);
    w.sim_groups.clear();
    w.rank = -1;
    w.size = 0;
  }
  // g and b are released here, outside the lock (joining the group's queue may take a moment).
}

ProcessGroupPtr world() {
  World& w = world_state();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.sim_groups.empty()) {
    if (t_sim_rank < 0)
      fail("tpu::dist: the sim backend's default group belongs to a rank's thread; call this inside "
           "tpu::dist::run_ranks (or use the groups of tpu::dist::sim_pod_groups)");
    return w.sim_groups[static_cast<size_t>(t_sim_rank)];
  }
  if (!w.group) fail("tpu::dist: no process group; call tpu::dist::init_process_group() first");
  return w.group;
}

void run_ranks(const std::function<void(int)>& fn) {
  World& w = world_state();
  int n = 0, base = 0;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (w.sim_groups.empty())
      fail("tpu::dist::run_ranks: no sim world; call init_process_group with backend \"sim\" first (gloo runs one "
           "process per rank: start them with tpu-run)");
    if (t_sim_rank >= 0) fail("tpu::dist::run_ranks: called on rank {}'s thread (run_ranks does not nest)", t_sim_rank);
    n = static_cast<int>(w.sim_groups.size());
    base = ++w.sim_runs << 16;
  }
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      t_sim_rank = r;
      t_group_base = base;
      t_next_group = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      } catch (...) {
        errors[static_cast<size_t>(r)] = "an exception that is not a std::exception";
      }
      t_sim_rank = -1;
    });
  for (auto& t : threads) t.join();
  std::string list;
  int failed = 0;
  for (int r = 0; r < n; ++r)
    if (!errors[static_cast<size_t>(r)].empty()) {
      list += fmt::format("{}rank {}: {}", failed ? "; " : "", r, errors[static_cast<size_t>(r)]);
      ++failed;
    }
  if (failed) fail("tpu::dist::run_ranks: {} of {} ranks failed: {}", failed, n, list);
}

int get_rank() { return world()->rank(); }
int get_world_size() { return world()->size(); }

ProcessGroupPtr new_group(const std::vector<int>& ranks_in) {
  World& w = world_state();
  std::lock_guard<std::mutex> lock(w.mu);
  const bool sim = !w.sim_groups.empty();
  if (!w.group && !sim) fail("tpu::dist::new_group: no process group; call tpu::dist::init_process_group() first");
  if (sim && t_sim_rank < 0) fail("tpu::dist::new_group: the sim backend's groups are made on the rank threads of run_ranks");
  std::vector<int> ranks = ranks_in;
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) fail("tpu::dist::new_group: the rank list is empty");
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end())
    fail("tpu::dist::new_group: the rank list [{}] repeats a rank", fmt::join(ranks_in, ", "));
  if (ranks.front() < 0 || ranks.back() >= w.size)
    fail("tpu::dist::new_group: the rank list [{}] has ranks outside the world 0..{}", fmt::join(ranks_in, ", "), w.size - 1);
  if (sim) {  // every rank thread makes its groups in the same order, so the k-th has one id on all
    const int id = -(t_group_base + t_next_group++) - 1;
    auto b = w.sim_groups[static_cast<size_t>(t_sim_rank)]->backend_impl().new_group(ranks, id);
    return std::make_shared<ProcessGroup>(b, ranks, t_sim_rank, w.timeout, w.check);
  }
  int id = w.next_group_id++;
  std::shared_ptr<Backend> b = w.backend->new_group(ranks, id);
  return std::make_shared<ProcessGroup>(b, ranks, w.rank, w.timeout, w.check);
}

#define TPU_DIST_GROUP (group ? group : world())
void all_reduce(const Tensor& t, ReduceOp op, const ProcessGroupPtr& group) { TPU_DIST_GROUP->all_reduce(t, op); }
Work all_reduce_async(const Tensor& t, ReduceOp op, const ProcessGroupPtr& group) {
  return TPU_DIST_GROUP->all_reduce_async(t, op);
}
void broadcast(const Tensor& t, int src, const ProcessGroupPtr& group) { TPU_DIST_GROUP->broadcast(t, src); }
void all_gather(const std::vector<Tensor>& out, const Tensor& in, const ProcessGroupPtr& group) {
  TPU_DIST_GROUP->all_gather(out, in);
}
void all_gather_into_tensor(const Tensor& out, const Tensor& in, const ProcessGroupPtr& group) {
  TPU_DIST_GROUP->all_gather_into_tensor(out, in);
}
void reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op, const ProcessGroupPtr& group) {
  TPU_DIST_GROUP->reduce_scatter_tensor(out, in, op);
}
void all_to_all(const std::vector<Tensor>& out, const std::vector<Tensor>& in, const ProcessGroupPtr& group) {
  TPU_DIST_GROUP->all_to_all(out, in);
}
void send(const Tensor& t, int dst, int tag, const ProcessGroupPtr& group) { TPU_DIST_GROUP->send(t, dst, tag); }
void recv(const Tensor& t, int src, int tag, const ProcessGroupPtr& group) { TPU_DIST_GROUP->recv(t, src, tag); }
void barrier(const ProcessGroupPtr& group) { TPU_DIST_GROUP->barrier(); }
#undef TPU_DIST_GROUP

DeviceMesh::DeviceMesh(std::vector<int> shape, std::vector<std::string> names)
    : shape_(std::move(shape)), names_(std::move(names)) {
  if (shape_.size() != names_.size() || shape_.empty())
    fail("tpu::dist::DeviceMesh: {} axis sizes but {} axis names", shape_.size(), names_.size());
  std::set<std::string> seen(names_.begin(), names_.end());
  if (seen.size() != names_.size()) fail("tpu::dist::DeviceMesh: axis names [{}] repeat a name", fmt::join(names_, ", "));
  int64_t total = 1;
  for (int s : shape_) {
    if (s < 1) fail("tpu::dist::DeviceMesh: axis sizes [{}] must be positive", fmt::join(shape_, ", "));
    total *= s;
  }
  int world_size = get_world_size();
  if (total != world_size)
    fail("tpu::dist::DeviceMesh: a mesh of [{}] has {} ranks but the world has {}", fmt::join(shape_, ", "), total, world_size);
  // Row-major strides; for each axis, every line of ranks that differ only along it, in order.
  std::vector<int> stride(shape_.size(), 1);
  for (size_t a = shape_.size() - 1; a-- > 0;) stride[a] = stride[a + 1] * shape_[a + 1];
  for (size_t a = 0; a < shape_.size(); ++a) {
    ProcessGroupPtr mine;
    for (int r = 0; r < world_size; ++r) {
      if ((r / stride[a]) % shape_[a] != 0) continue;  // r starts a line along axis a
      std::vector<int> line;
      for (int i = 0; i < shape_[a]; ++i) line.push_back(r + i * stride[a]);
      auto g = new_group(line);
      if (g->is_member()) mine = g;
    }
    groups_.push_back(mine);
  }
}

int DeviceMesh::axis(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int>(i);
  fail("tpu::dist::DeviceMesh: no axis '{}' (axes: {})", name, fmt::join(names_, ", "));
}

ProcessGroupPtr DeviceMesh::group(const std::string& name) const { return groups_[static_cast<size_t>(axis(name))]; }

std::vector<int> DeviceMesh::coordinate() const {
  int r = get_rank();
  std::vector<int> c(shape_.size());
  for (size_t a = shape_.size(); a-- > 0;) {
    c[a] = r % shape_[a];
    r /= shape_[a];
  }
  return c;
}

}  // namespace tpu::dist
