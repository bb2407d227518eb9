// ProcessGroup: argument checks, the header exchange, staging through contiguous host copies,
// and the queue that runs a group's collectives in call order. The backend does the transfer.
#include <fmt/ranges.h>

#include <map>

#include "device/stream.h"
#include "tpucore/dist/backend.h"
#include "tpucore/dist/compiled.h"
#include "tpucore/dist/header.h"
#include "tpucore/dist/work.h"
#include "tpucore/ops.h"

namespace tpu::dist {

using detail::Header;
using detail::OpCode;

namespace {

struct Staged {
  Tensor user, buf;
  bool copy_back = false;
  void finish() const {
    if (!copy_back) return;
    Tensor u = user;
    u.copy_(buf);
  }
};

// The reduced values divided by n (avg), on a contiguous host tensor of a floating dtype.
void divide(const Tensor& t, int n) {
  if (!t.device().is_cpu()) {  // a chip's buffer (sim backend): divide a host copy
    Tensor h = t.to(Device()).contiguous();
    divide(h, n);
    Tensor(t).copy_(h);
    return;
  }
  dispatch_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      T* p = static_cast<T*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(static_cast<float>(p[i]) / static_cast<float>(n));
    }
  });
}

std::vector<Header> headers(const std::vector<std::vector<char>>& all) {
  std::vector<Header> hs;
  for (const auto& b : all) hs.push_back(detail::from_bytes(b));
  return hs;
}

Backend::Agreement judge_headers(const std::vector<std::vector<char>>& all) {
  auto hs = headers(all);
  bool all_bad = true, agree = true;
  for (const auto& h : hs) {
    all_bad = all_bad && h.bad;
    agree = agree && !h.bad && detail::same(h, hs[0]);
  }
  if (all_bad) return Backend::Agreement::none_ran;
  return agree ? Backend::Agreement::agree : Backend::Agreement::disagree;
}

// Every rank's header for the call, exchanged by the backend alongside (or before) `body`.
void run_checked(Backend& b, const Header& mine, const std::string& what, const std::function<void()>& body) {
  auto hs = headers(b.run_checked(detail::to_bytes(mine), judge_headers, body));
  std::vector<int> bad;
  for (size_t i = 0; i < hs.size(); ++i)
    if (hs[i].bad) bad.push_back(static_cast<int>(i));
  if (!bad.empty())
    fail("{}: rank(s) {} passed invalid arguments (see their errors), so every rank abandoned the call", what, fmt::join(bad, ", "));
  bool agree = true;
  for (const auto& h : hs) agree = agree && detail::same(h, hs[0]);
  if (agree) return;
  std::string list;
  for (size_t i = 0; i < hs.size(); ++i) list += fmt::format("{}rank {}: {}", i ? "; " : "", i, detail::describe(hs[i]));
  fail("{}: the ranks disagree on the call ({}), so every rank abandoned it (outputs unspecified)", what, list);
}

uint64_t p2p_slot(uint8_t kind, int tag, uint32_t seq) {
  return (uint64_t{kind} << 56) | (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 32) | seq;
}
constexpr uint8_t kHeaderSlot = 0x70, kDataSlot = 0x71;

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Backend> backend, std::vector<int> global_ranks, int my_global_rank,
                           std::chrono::milliseconds timeout, bool check)
    : backend_(std::move(backend)), ranks_(std::move(global_ranks)), timeout_(timeout), check_(check) {
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (ranks_[i] == my_global_rank && backend_) rank_ = static_cast<int>(i);
  if (rank_ >= 0) queue_ = std::make_unique<Queue>();
}

ProcessGroup::~ProcessGroup() { detail::forget_group(this); }

int ProcessGroup::rank() const {
  require_member("rank");
  return rank_;
}

std::string ProcessGroup::backend_name() const { return backend_ ? backend_->name() : "none"; }

Backend& ProcessGroup::backend_impl() const {
  require_member("backend_impl");
  return *backend_;
}

std::string ProcessGroup::where() const {
  std::string s = fmt::format("{}, rank {} of {}", backend_name(), rank_, size());
  bool world = true;
  for (size_t i = 0; i < ranks_.size(); ++i) world = world && ranks_[i] == static_cast<int>(i);
  if (!world) s += fmt::format(", group of world ranks [{}]", fmt::join(ranks_, ", "));
  return s;
}

void ProcessGroup::require_member(const char* op) const {
  if (rank_ < 0) fail("tpu::dist: {}: this rank is not a member of the group of world ranks [{}]", op, fmt::join(ranks_, ", "));
}

namespace {

// Per-call context: the checks that name the op, and staging.
struct Call {
  Call(Backend& backend, OpCode o, std::string w) : b(backend), op(o), what(std::move(w)) {}
  Backend& b;
  OpCode op;
  std::string what;
  Device device;
  bool have_device = false;

  void tensor(const Tensor& t, const char* arg) {
    if (!t.defined()) fail("{}: {} is an undefined tensor", what, arg);
    Device d = t.device();
    if (std::string why = b.reject(d); !why.empty()) fail("{}: {} {}", what, arg, why);
    if (!b.native(d) && d.type != DeviceType::sim && !d.is_cpu())
      fail("{}: {} is on {}; the {} backend takes cpu tensors and sim tensors (staged through the host)", what, arg,
           d.str(), b.name());
    if (have_device && d != device)
      fail("{}: {} is on {} but the call's first tensor is on {}; one call's tensors share a device", what, arg,
           d.str(), device.str());
    device = d;
    have_device = true;
  }
  void same_dtype(const Tensor& a, const Tensor& o, const char* arg) {
    if (a.dtype() != o.dtype())
      fail("{}: {} is {} but the input is {}", what, arg, dtype_name(o.dtype()), dtype_name(a.dtype()));
  }
  void floating_for_avg(ReduceOp r, const Tensor& t) {
    if (r == ReduceOp::avg && !is_floating(t.dtype()))
      fail("{}: avg needs a floating dtype; the tensor is {} (use sum and divide)", what, dtype_name(t.dtype()));
  }
  Staged stage(const Tensor& t, bool copy_in, bool is_output) {
    if (b.native(t.device()) && t.is_contiguous()) return {t, t, false};
    Tensor buf = copy_in ? t.to(Device()).contiguous() : empty(t.shape(), TensorOptions(t.dtype(), Device()));
    return {t, buf, is_output};
  }
};

}  // namespace

namespace {

struct Plan {
  Header header;
  std::function<void()> body;                              // on the group's queue
  std::function<void(std::chrono::milliseconds)> finish;   // in wait()
};

// Prepares a call on the caller's thread (checks, staging) and queues it. Invalid arguments
// throw here; with the header check on, this rank still joins the header exchange marked
// "bad", so the other ranks fail at once instead of waiting for it.
thread_local bool t_blocking_call = false;  // set by the blocking forms: run inline if idle

struct BlockingCall {
  BlockingCall() { t_blocking_call = true; }
  ~BlockingCall() { t_blocking_call = false; }
};

template <class Q, class F>
Work launch(Q& q, Backend* b, bool check, std::chrono::milliseconds timeout, const Call& c, F&& prepare) {
  Plan plan;
  try {
    plan = prepare();
  } catch (const Error&) {
    if (check) {
      Header bad = detail::make_header(c.op, nullptr);
      bad.bad = 1;
      q.tasks.push([b, bad] {
        try {
          b->run_checked(detail::to_bytes(bad), judge_headers, nullptr);
        } catch (const std::exception&) {  // this rank already reports its own error
        }
      });
    }
    throw;
  }
  auto st = std::make_shared<detail::WorkState>();
  st->what = c.what;
  st->timeout = timeout;
  st->finish = std::move(plan.finish);
  // The collective runs on the caller's current stream of a sim tensor's chip (the queue's
  // thread takes it over for the call), as a CUDA collective runs on the current stream.
  device::StreamId stream = c.have_device && c.device.type == DeviceType::sim ? device::current_stream(c.device) : 0;
  std::function<void()> task = [b, check, what = c.what, h = plan.header, body = std::move(plan.body), dev = c.device,
                                stream] {
    struct OnStream {
      Device d;
      device::StreamId prev;
      bool set;
      OnStream(Device dv, device::StreamId s) : d(dv), prev(0), set(s != 0) {
        if (set) {
          prev = device::current_stream(d);
          device::set_current_stream(d, s);
        }
      }
      ~OnStream() {
        if (set) device::set_current_stream(d, prev);
      }
    } on_stream(dev, stream);
    try {
      if (check) run_checked(*b, h, what, body);
      else if (body) body();
    } catch (const Error&) {
      throw;  // the ranks disagreed: every rank saw the same headers, so the group stays in step
    } catch (const std::exception& e) {
      throw detail::TransportError(fmt::format("{} failed: {}", what, e.what()));
    }
  };
  st->done = t_blocking_call ? q.tasks.run_or_push(std::move(task)) : q.tasks.push(std::move(task));
  return Work(st);
}

std::function<void(std::chrono::milliseconds)> finisher(std::vector<Staged> s) {
  return [s = std::move(s)](std::chrono::milliseconds) {
    for (const auto& x : s) x.finish();
  };
}

}  // namespace

#define TPU_DIST_CALL(opcode)                                                                        \
  require_member(detail::op_name(opcode));                                                           \
  Call c{*backend_, opcode, fmt::format("tpu::dist {} ({})", detail::op_name(opcode), where())}; \
  Backend* b = backend_.get();                                                                        \
  int n = size()

Work ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  if (detail::traced(t)) return detail::traced_all_reduce(*this, t, op);
  TPU_DIST_CALL(OpCode::all_reduce);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(t, "the tensor");
    c.floating_for_avg(op, t);
    Staged s = c.stage(t, true, true);
    return Plan{detail::make_header(c.op, &t, op), [b, s, op, n] {
                  if (s.buf.numel() == 0) return;
                  b->all_reduce(s.buf, op);
                  if (op == ReduceOp::avg) divide(s.buf, n);
                }, finisher({s})};
  });
}

Work ProcessGroup::broadcast_async(const Tensor& t, int src) {
  if (detail::traced(t)) return detail::traced_broadcast(*this, t, src);
  TPU_DIST_CALL(OpCode::broadcast);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(t, "the tensor");
    if (src < 0 || src >= n) fail("{}: src {} is not a rank of this group (0..{})", c.what, src, n - 1);
    Staged s = c.stage(t, rank_ == src, true);
    return Plan{detail::make_header(c.op, &t, ReduceOp::sum, src), [b, s, src] {
                  if (s.buf.numel() > 0) b->broadcast(s.buf, src);
                }, finisher({s})};
  });
}

Work ProcessGroup::all_gather_into_tensor_async(const Tensor& out, const Tensor& in) {
  if (detail::traced(in)) return detail::traced_all_gather_into_tensor(*this, out, in);
  TPU_DIST_CALL(OpCode::all_gather_into_tensor);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(in, "the input");
    c.tensor(out, "the output");
    c.same_dtype(in, out, "the output");
    Shape cat = in.shape(), stack = in.shape();
    if (in.dim() == 0) cat = Shape{n};
    else cat[0] *= n;
    stack.insert(0, n);
    if (out.shape() != cat && out.shape() != stack)
      fail("{}: the output is {} but an input of {} on {} ranks needs {} (or {})", c.what, out.shape(), in.shape(),
           n, cat, stack);
    Staged si = c.stage(in, true, false), so = c.stage(out, false, true);
    return Plan{detail::make_header(c.op, &in), [b, si, so] {
                  if (si.buf.numel() > 0) b->all_gather(so.buf, si.buf);
                }, finisher({so})};
  });
}

Work ProcessGroup::all_gather_async(const std::vector<Tensor>& out, const Tensor& in) {
  if (detail::traced(in)) detail::not_traceable("all_gather (list form)");
  TPU_DIST_CALL(OpCode::all_gather);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(in, "the input");
    if (static_cast<int>(out.size()) != n)
      fail("{}: the output list has {} tensors; the group has {} ranks", c.what, out.size(), n);
    for (size_t i = 0; i < out.size(); ++i) {
      std::string arg = fmt::format("output {}", i);
      c.tensor(out[i], arg.c_str());
      c.same_dtype(in, out[i], arg.c_str());
      if (out[i].shape() != in.shape())
        fail("{}: output {} is {} but the input is {}", c.what, i, out[i].shape(), in.shape());
    }
    Staged si = c.stage(in, true, false);
    int64_t k = in.numel();
    Tensor all = empty(Shape{k * n}, TensorOptions(in.dtype(), Device()));
    return Plan{detail::make_header(c.op, &in, ReduceOp::sum, 0, n), [b, si, all] {
                  if (si.buf.numel() > 0) b->all_gather(all, si.buf);
                },
                [out, all, k, shape = in.shape()](std::chrono::milliseconds) {
                  for (size_t i = 0; i < out.size(); ++i)
                    Tensor(out[i]).copy_(all.narrow(0, static_cast<int64_t>(i) * k, k).reshape(shape));
                }};
  });
}

Work ProcessGroup::reduce_scatter_tensor_async(const Tensor& out, const Tensor& in, ReduceOp op) {
  if (detail::traced(in)) return detail::traced_reduce_scatter_tensor(*this, out, in, op);
  TPU_DIST_CALL(OpCode::reduce_scatter_tensor);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(in, "the input");
    c.tensor(out, "the output");
    c.same_dtype(in, out, "the output");
    c.floating_for_avg(op, in);
    Shape want = out.shape();
    if (out.dim() == 0) want = Shape{n};
    else want[0] *= n;
    if (in.shape() != want)
      fail("{}: the input is {} but an output of {} on {} ranks needs an input of {}", c.what, in.shape(),
           out.shape(), n, want);
    Staged si = c.stage(in, true, false), so = c.stage(out, false, true);
    return Plan{detail::make_header(c.op, &in, op), [b, si, so, op, n] {
                  if (so.buf.numel() == 0) return;
                  b->reduce_scatter(so.buf, si.buf, op);
                  if (op == ReduceOp::avg) divide(so.buf, n);
                }, finisher({so})};
  });
}

Work ProcessGroup::all_to_all_single_async(const Tensor& out, const Tensor& in) {
  if (detail::traced(in)) return detail::traced_all_to_all_single(*this, out, in, {}, {});
  TPU_DIST_CALL(OpCode::all_to_all_single);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(in, "the input");
    c.tensor(out, "the output");
    c.same_dtype(in, out, "the output");
    if (in.dim() == 0 || in.size(0) % n != 0)
      fail("{}: the input {} must have a dim 0 that {} ranks split evenly", c.what, in.shape(), n);
    if (out.shape() != in.shape()) fail("{}: the output is {} but the input is {}", c.what, out.shape(), in.shape());
    Staged si = c.stage(in, true, false), so = c.stage(out, false, true);
    return Plan{detail::make_header(c.op, &in), [b, si, so] {
                  if (si.buf.numel() > 0) b->all_to_all(so.buf, si.buf);
                }, finisher({so})};
  });
}

namespace {
// The header of an uneven all-to-all: op, dtype and the trailing shape; dim 0 (which may differ
// across ranks) left out, count -1 marks the uneven form.
Header uneven_header(OpCode op, const Tensor& t) {
  Header h = detail::make_header(op, &t, ReduceOp::sum, 0, -1);
  h.numel = 0;
  if (t.dim() > 0) h.dims[0] = 0;
  return h;
}
}  // namespace

Work ProcessGroup::all_to_all_single_async(const Tensor& out, const Tensor& in, const std::vector<int64_t>& output_split_sizes,
                                           const std::vector<int64_t>& input_split_sizes) {
  if (output_split_sizes.empty() && input_split_sizes.empty()) return all_to_all_single_async(out, in);
  if (detail::traced(in)) return detail::traced_all_to_all_single(*this, out, in, output_split_sizes, input_split_sizes);
  TPU_DIST_CALL(OpCode::all_to_all_single);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    c.tensor(in, "the input");
    c.tensor(out, "the output");
    c.same_dtype(in, out, "the output");
    if (in.dim() == 0 || out.dim() != in.dim())
      fail("{}: the input {} and the output {} need the same number of dims (at least 1)", c.what, in.shape(), out.shape());
    for (int d = 1; d < in.dim(); ++d)
      if (in.size(d) != out.size(d))
        fail("{}: the output {} and the input {} differ beyond dim 0", c.what, out.shape(), in.shape());
    const auto ins = splits_or_even(input_split_sizes, in, n, c.what, "input_split_sizes", "input");
    const auto outs = splits_or_even(output_split_sizes, out, n, c.what, "output_split_sizes", "output");
    int64_t row = 1;
    for (int d = 1; d < in.dim(); ++d) row *= in.size(d);
    std::vector<int64_t> send, recv;
    for (int64_t x : ins) send.push_back(x * row);
    for (int64_t x : outs) recv.push_back(x * row);
    Staged si = c.stage(in, true, false), so = c.stage(out, false, true);
    Tensor fi = si.buf.reshape(Shape{si.buf.numel()}), fo = so.buf.reshape(Shape{so.buf.numel()});
    return Plan{uneven_header(c.op, in), [b, fi, fo, send, recv, what = c.what] {
                  run_all_to_all_v(*b, fo, fi, send, recv, what);
                }, finisher({so})};
  });
}

Work ProcessGroup::all_to_all_async(const std::vector<Tensor>& out, const std::vector<Tensor>& in) {
  if (detail::traced(in.empty() ? Tensor() : in[0])) detail::not_traceable("all_to_all");
  TPU_DIST_CALL(OpCode::all_to_all);
  return launch(*queue_, b, check_, timeout_, c, [&] {
    if (static_cast<int>(in.size()) != n || static_cast<int>(out.size()) != n)
      fail("{}: the lists have {} inputs and {} outputs; the group has {} ranks", c.what, in.size(), out.size(), n);
    // Tensors of any shape: in[j] goes to rank j (flattened), out[i] receives rank i's in[me]
    // and must hold as many elements (checked across ranks before any data moves).
    std::vector<int64_t> send, recv;
    int64_t ns = 0, nr = 0;
    for (int i = 0; i < n; ++i) {
      std::string ai = fmt::format("input {}", i), ao = fmt::format("output {}", i);
      c.tensor(in[i], ai.c_str());
      c.tensor(out[i], ao.c_str());
      c.same_dtype(in[0], in[i], ai.c_str());
      c.same_dtype(in[0], out[i], ao.c_str());
      send.push_back(in[i].numel());
      recv.push_back(out[i].numel());
      ns += in[i].numel();
      nr += out[i].numel();
    }
    TensorOptions host(in[0].dtype(), Device());
    Tensor packed = empty(Shape{ns}, host), result = empty(Shape{nr}, host);
    int64_t off = 0;
    for (size_t i = 0; i < in.size(); off += send[i], ++i)
      if (send[i] > 0) packed.narrow(0, off, send[i]).copy_(in[i].reshape(Shape{send[i]}));
    Header h = uneven_header(c.op, in[0]);
    h.ndim = 0;
    std::fill(std::begin(h.dims), std::end(h.dims), 0);
    h.count = n;
    return Plan{h, [b, packed, result, send, recv, what = c.what] {
                  run_all_to_all_v(*b, result, packed, send, recv, what);
                },
                [out, result, recv](std::chrono::milliseconds) {
                  int64_t off = 0;
                  for (size_t i = 0; i < out.size(); ++i) {
                    if (recv[i] > 0) Tensor(out[i]).copy_(result.narrow(0, off, recv[i]).reshape(out[i].shape()));
                    off += recv[i];
                  }
                }};
  });
}

Work ProcessGroup::barrier_async() {
  TPU_DIST_CALL(OpCode::barrier);
  (void)n;
  return launch(*queue_, b, check_, timeout_, c, [&] {
    return Plan{detail::make_header(c.op, nullptr), [b] { b->barrier(); }, nullptr};
  });
}

#undef TPU_DIST_CALL

#define TPU_DIST_BLOCKING(call) \
  Work w;                       \
  {                             \
    BlockingCall b;             \
    w = call;                   \
  }                             \
  w.wait()
void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) { TPU_DIST_BLOCKING(all_reduce_async(t, op)); }
void ProcessGroup::broadcast(const Tensor& t, int src) { TPU_DIST_BLOCKING(broadcast_async(t, src)); }
void ProcessGroup::all_gather(const std::vector<Tensor>& out, const Tensor& in) {
  TPU_DIST_BLOCKING(all_gather_async(out, in));
}
void ProcessGroup::all_gather_into_tensor(const Tensor& out, const Tensor& in) {
  TPU_DIST_BLOCKING(all_gather_into_tensor_async(out, in));
}
void ProcessGroup::reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op) {
  TPU_DIST_BLOCKING(reduce_scatter_tensor_async(out, in, op));
}
void ProcessGroup::all_to_all(const std::vector<Tensor>& out, const std::vector<Tensor>& in) {
  TPU_DIST_BLOCKING(all_to_all_async(out, in));
}
void ProcessGroup::all_to_all_single(const Tensor& out, const Tensor& in) {
  TPU_DIST_BLOCKING(all_to_all_single_async(out, in));
}
void ProcessGroup::all_to_all_single(const Tensor& out, const Tensor& in, const std::vector<int64_t>& output_split_sizes,
                                     const std::vector<int64_t>& input_split_sizes) {
  TPU_DIST_BLOCKING(all_to_all_single_async(out, in, output_split_sizes, input_split_sizes));
}
void ProcessGroup::barrier() { TPU_DIST_BLOCKING(barrier_async()); }
#undef TPU_DIST_BLOCKING

// Point to point. Both sides post at call time (send: header and data; recv: header, or data
// when the check is off) so that isend/irecv pairs in any order cannot deadlock; message k from
// a to b with tag t matches the k-th recv of b from a with tag t. A receiver whose header does
// not match what it expects drains the message and fails naming both sides (the sender's send
// completes: the data is discarded).
namespace {
// Checks the peer and tag of a send or recv and takes the next message number for (peer, tag).
uint32_t next_p2p_seq(const std::string& what, const char* side, int peer, int tag, int size, int rank,
                      std::mutex& mu, std::map<std::pair<int, int>, uint32_t>& seqs) {
  if (peer < 0 || peer >= size || peer == rank)
    fail("{}: {} {} is not another rank of this group (0..{}, this rank is {})", what, side, peer, size - 1, rank);
  if (tag < 0 || tag >= (1 << 24)) fail("{}: tag {} is outside 0..2^24-1", what, tag);
  std::lock_guard<std::mutex> lock(mu);
  return seqs[{peer, tag}]++;
}
}  // namespace

Work ProcessGroup::send_async(const Tensor& t, int dst, int tag) {
  if (detail::traced(t)) detail::not_traceable("send");
  require_member("send");
  Call c{*backend_, OpCode::send_recv, fmt::format("tpu::dist send to rank {} ({})", dst, where())};
  c.tensor(t, "the tensor");
  const uint32_t seq = next_p2p_seq(c.what, "dst", dst, tag, size(), rank_, queue_->mu, queue_->send_seq);
  Staged s = c.stage(t, true, false);
  auto header = std::make_shared<std::vector<char>>(detail::to_bytes(detail::make_header(c.op, &t)));
  std::shared_ptr<Backend::Pending> ph, pd;
  try {
    if (check_) ph = backend_->post_send(header->data(), header->size(), dst, p2p_slot(kHeaderSlot, tag, seq));
    if (t.numel() > 0) pd = backend_->post_send_tensor(s.buf, dst, p2p_slot(kDataSlot, tag, seq));
  } catch (const std::exception& e) {
    fail("{} failed: {}", c.what, e.what());
  }
  auto st = std::make_shared<detail::WorkState>();
  st->what = c.what;
  st->timeout = timeout_;
  std::promise<void> ready;
  ready.set_value();
  st->done = ready.get_future().share();
  st->finish = [s, header, ph, pd, what = c.what](std::chrono::milliseconds timeout) {
    try {
      if (ph) ph->wait(timeout);
      if (pd) pd->wait(timeout);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("{} failed: {}", what, e.what());
    }
  };
  return Work(st);
}

Work ProcessGroup::recv_async(const Tensor& t, int src, int tag) {
  if (detail::traced(t)) detail::not_traceable("recv");
  require_member("recv");
  Call c{*backend_, OpCode::send_recv, fmt::format("tpu::dist recv from rank {} ({})", src, where())};
  c.tensor(t, "the tensor");
  const uint32_t seq = next_p2p_seq(c.what, "src", src, tag, size(), rank_, queue_->mu, queue_->recv_seq);
  Staged s = c.stage(t, false, true);
  Header mine = detail::make_header(c.op, &t);
  auto theirs = std::make_shared<std::vector<char>>(sizeof(Header));
  std::shared_ptr<Backend::Pending> ph, pd;
  Backend* b = backend_.get();
  auto backend = backend_;  // keeps the backend alive for the finish below
  try {
    if (check_) ph = b->post_recv(theirs->data(), theirs->size(), src, p2p_slot(kHeaderSlot, tag, seq));
    else if (t.numel() > 0) pd = b->post_recv_tensor(s.buf, src, p2p_slot(kDataSlot, tag, seq));
  } catch (const std::exception& e) {
    fail("{} failed: {}", c.what, e.what());
  }
  auto st = std::make_shared<detail::WorkState>();
  st->what = c.what;
  st->timeout = timeout_;
  std::promise<void> ready;
  ready.set_value();
  st->done = ready.get_future().share();
  int me = rank_;
  st->finish = [s, mine, theirs, ph, pd, backend, src, tag, seq, me, what = c.what](std::chrono::milliseconds timeout) {
    try {
      auto data = pd;
      if (ph) {
        ph->wait(timeout);
        Header h = detail::from_bytes(*theirs);
        if (!detail::same(h, mine)) {
          size_t n = h.dtype < kNumDTypes ? static_cast<size_t>(h.numel) * dtype_size(static_cast<DType>(h.dtype)) : 0;
          if (n > 0) {  // drain it so the sender completes
            std::vector<char> scratch(n);
            backend->post_recv(scratch.data(), n, src, p2p_slot(kDataSlot, tag, seq))->wait(timeout);
          }
          fail("{}: rank {} sent {} but rank {} expects {}", what, src, detail::describe(h), me, detail::describe(mine));
        }
        if (s.buf.numel() > 0)
          data = backend->post_recv_tensor(s.buf, src, p2p_slot(kDataSlot, tag, seq));
      }
      if (data) data->wait(timeout);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("{} failed: {}", what, e.what());
    }
    s.finish();
  };
  return Work(st);
}

}  // namespace tpu::dist
