#include "device/profiling.h"

#include <atomic>

namespace tpu::device {
namespace {
std::atomic<ProgramRunSink*> g_sink{nullptr};
thread_local const char* t_tag = nullptr;
}  // namespace

void set_program_run_sink(ProgramRunSink* sink) { g_sink.store(sink, std::memory_order_release); }
ProgramRunSink* program_run_sink() { return g_sink.load(std::memory_order_acquire); }
void set_work_tag(const char* tag) { t_tag = tag; }
const char* work_tag() { return t_tag ? t_tag : ""; }

}  // namespace tpu::device
