#include "graph/async_ops.h"

#include <mutex>
#include <string>
#include <unordered_map>

namespace tpu::graph {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<const ops::OpDef*, AsyncStartFn> by_op;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void register_async_op(std::string_view op, AsyncStartFn start) {
  const ops::OpDef* def = ops::find_op(op);
  TPU_CHECK(def != nullptr, "register_async_op: no op named '{}'", op);
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.by_op[def] = start;
}

AsyncStartFn async_start_fn(const ops::OpDef& op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.by_op.find(&op);
  return it == r.by_op.end() ? nullptr : it->second;
}

}  // namespace tpu::graph
