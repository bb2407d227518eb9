#include "sim/chip.h"

#include <fmt/format.h>

#include "sim/error.h"
#include "sim/executor.h"
#include "sim/presets.h"

namespace tpu::sim {

Chip::Chip(const ChipConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  hbm_ = std::make_unique<Memory>(Space::hbm, cfg_.memory.hbm_bytes);
  vmem_ = std::make_unique<Memory>(Space::vmem, cfg_.memory.vmem_bytes);
}

Chip Chip::create(const std::string& preset_or_json) { return Chip(load_config(preset_or_json)); }

Chip::Chip(Chip&&) noexcept = default;
Chip& Chip::operator=(Chip&&) noexcept = default;
Chip::~Chip() = default;

namespace {
void check_host(const Memory& m, uint64_t addr, uint64_t n, const char* what) {
  if (!m.contains(addr, n))
    throw SimError(fmt::format("host {} of {}[{}, +{}) is outside {} ({} bytes)", what, space_name(m.space()), addr, n,
                               space_name(m.space()), m.size()));
}
}  // namespace

void Chip::write_hbm(uint64_t addr, const void* src, uint64_t n) {
  check_host(*hbm_, addr, n, "write");
  hbm_->write(addr, src, n);
}
void Chip::read_hbm(uint64_t addr, void* dst, uint64_t n) const {
  check_host(*hbm_, addr, n, "read");
  hbm_->read(addr, dst, n);
}
void Chip::fill_hbm(uint64_t addr, uint8_t value, uint64_t n) {
  check_host(*hbm_, addr, n, "fill");
  hbm_->fill(addr, value, n);
}
void Chip::write_vmem(uint64_t addr, const void* src, uint64_t n) {
  check_host(*vmem_, addr, n, "write");
  vmem_->write(addr, src, n);
}
void Chip::read_vmem(uint64_t addr, void* dst, uint64_t n) const {
  check_host(*vmem_, addr, n, "read");
  vmem_->read(addr, dst, n);
}

Memory& Chip::vmem(int core) {
  if (core <= 0) return *vmem_;
  if (core >= cfg_.timing.megacore)
    throw SimError(fmt::format("chip '{}' has no TensorCore {} (timing.megacore = {})", cfg_.name, core, cfg_.timing.megacore));
  if (core_vmem_.size() < size_t(core)) core_vmem_.resize(size_t(core));
  auto& m = core_vmem_[size_t(core - 1)];
  if (!m) m = std::make_unique<Memory>(Space::vmem, cfg_.memory.vmem_bytes);
  return *m;
}

RunResult Chip::run(const Program& prog, const RunOptions& opt) {
  if (!prog.finalized) {
    Program copy = prog;
    copy.finalize();
    copy.check_against(cfg_);
    return detail::execute(*this, copy, opt);
  }
  prog.check_against(cfg_);
  return detail::execute(*this, prog, opt);
}

}  // namespace tpu::sim
