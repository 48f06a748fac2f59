// The device executor's host build (see device_host.h).
#include "testing/device_host.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/dtype.h"
#include "device/device_interp.h"
#include "device/device_status.h"

namespace jax_blink {

namespace {

// The interpreter's primitives on the host: one lane per block, flags as
// atomics with the GPU build's acquire/release pairs.
struct HostEnv {
  // The fault of this block's rank (null: none): publishes left, shared by
  // its blocks, and whether the rank has stopped.
  std::atomic<int64_t>* budget = nullptr;
  std::atomic<bool>* halted = nullptr;

  uint64_t Load(const uint64_t* p) const {
    return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(p)).load(std::memory_order_acquire);
  }
  // A stopped rank writes nothing more (as a kernel that hangs or dies).
  bool Stopped() const { return halted != nullptr && halted->load(std::memory_order_relaxed); }
  void Store(uint64_t* p, uint64_t v) const {
    if (Stopped()) return;
    std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
  }
  void Publish(uint64_t* flag, uint64_t v) const {
    if (budget != nullptr && budget->fetch_sub(1, std::memory_order_relaxed) <= 0) {
      halted->store(true, std::memory_order_relaxed);
    }
    Store(flag, v);
  }
  void Fence() const { std::atomic_thread_fence(std::memory_order_seq_cst); }
  bool Poisoned(const uint64_t* error, uint64_t gen) const {
    return Stopped() || Load(error) >= gen;
  }
  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void Pause(uint32_t k) const {
    if (k < 16) return;
    if (k < 256) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  bool Leader() const { return true; }
  int Lane() const { return 0; }
  int Lanes() const { return 1; }
  void Sync() const {}
  int Share(int v) const { return v; }
};

}  // namespace

std::string HostDeviceMemory::Alloc(int /*device*/, size_t bytes, void** p) {
  std::lock_guard<std::mutex> lk(mu_);
  Block b;
  auto it = pool_.find(bytes);
  if (it != pool_.end() && !it->second.empty()) {
    b = std::move(it->second.back());  // with an earlier owner's bytes
    it->second.pop_back();
  } else {
    b.bytes = bytes;
    b.words.reset(new uint64_t[std::max<size_t>((bytes + 7) / 8, 1)]());
  }
  *p = b.words.get();
  live_[*p] = std::move(b);
  return "";
}

void HostDeviceMemory::Free(int /*device*/, void* p) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;
  pool_[it->second.bytes].push_back(std::move(it->second));
  live_.erase(it);
}

void HostDeviceMemory::Write(void* dst, const void* src, size_t bytes) {
  if (!delayed_) {
    if (src != nullptr) {
      std::memcpy(dst, src, bytes);
    } else {
      std::memset(dst, 0, bytes);
    }
    return;
  }
  Pending w;
  w.dst = dst;
  w.zero = src == nullptr;
  if (src != nullptr) {
    const auto* b = static_cast<const unsigned char*>(src);
    w.bytes.assign(b, b + bytes);  // read at the call, as a staged pageable copy
  } else {
    w.bytes.resize(bytes);
  }
  pending_.push_back(std::move(w));
}

std::string HostDeviceMemory::Upload(int /*device*/, void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  Write(dst, src, bytes);
  return "";
}

std::string HostDeviceMemory::Zero(int /*device*/, void* dst, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  Write(dst, nullptr, bytes);
  return "";
}

std::string HostDeviceMemory::Finish() {
  Land();
  return "";
}

void HostDeviceMemory::Land() {
  std::lock_guard<std::mutex> lk(mu_);
  for (Pending& w : pending_) {
    if (w.zero) {
      std::memset(w.dst, 0, w.bytes.size());
    } else {
      std::memcpy(w.dst, w.bytes.data(), w.bytes.size());
    }
  }
  pending_.clear();
}

std::string DeviceHostExecutor::Create(const Schedule& s, int max_blocks_per_rank,
                                       std::shared_ptr<HostDeviceMemory> mem,
                                       std::unique_ptr<DeviceHostExecutor>* out) {
  auto e = std::unique_ptr<DeviceHostExecutor>(new DeviceHostExecutor());
  e->s_ = &s;
  std::string err = BuildDeviceProgram(s, max_blocks_per_rank, &e->program_);
  if (!err.empty()) return err;
  const DeviceProgram& p = e->program_;
  e->mem_ = mem ? std::move(mem) : std::make_shared<HostDeviceMemory>(false);
  err = SetUpDeviceState(p, std::vector<int>(p.nranks, 0), NextDeviceExecutorId(), *e->mem_,
                         &e->state_);
  if (!err.empty()) return err;
  e->acc_.resize(p.nranks);
  for (auto& a : e->acc_) a.assign(static_cast<size_t>(p.WorkspaceBytes()), 0);
  *out = std::move(e);
  return "";
}

DeviceHostExecutor::~DeviceHostExecutor() {
  if (mem_) FreeDeviceState(*mem_, &state_);
}

void DeviceHostExecutor::WriteHeaderExecutor(uint64_t executor) {
  for (DeviceState::OnDevice& od : state_.on_device) {
    static_cast<DeviceProgramHeader*>(od.blob)->executor = executor;
  }
}

std::vector<Status> DeviceHostExecutor::Run(const std::vector<const void*>& in,
                                            const std::vector<void*>& out, int64_t timeout_ms,
                                            const std::vector<uint8_t>& skip,
                                            const DeviceHostFault& fault) {
  const DeviceProgram& p = program_;
  const uint64_t gen = ++generation_;
  std::vector<DeviceRankBuffers> bufs(p.nranks);
  for (int64_t r = 0; r < p.nranks; ++r) {
    bufs[r].in = in[r];
    bufs[r].out = out[r];
    bufs[r].acc = p.acc_is_out ? out[r] : static_cast<void*>(acc_[r].data());
    bufs[r].flags = state_.flags[r];
  }
  std::atomic<int64_t> budget{fault.publishes};
  std::atomic<bool> halted{false};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < p.nranks; ++r) {
    if (!skip.empty() && skip[r]) continue;
    const DeviceRank& dr = p.ranks[r];
    const DeviceProgramView view = state_.on_device[state_.view_of_rank[r]].view;
    const DeviceCallView call{bufs.data(),     state_.control,        gen,
                              std::max<int64_t>(timeout_ms, 1) * 1000000,
                              state_.executor, static_cast<int32_t>(r), dr.block_begin,
                              dr.nblocks};
    for (int32_t b = 0; b < dr.nblocks; ++b) {
      HostEnv env;
      if (fault.rank == r) {
        env.budget = &budget;
        env.halted = &halted;
      }
      threads.emplace_back([env, view, call, b]() mutable { RunDeviceBlock(env, view, call, b); });
    }
  }
  for (std::thread& t : threads) t.join();
  std::vector<Status> res(p.nranks);
  for (int64_t r = 0; r < p.nranks; ++r) {
    if (!skip.empty() && skip[r]) continue;
    res[r] = DeviceRankStatus(p, state_.control, r, gen, timeout_ms, state_.executor,
                              "generation " + std::to_string(gen));
  }
  // Writes of the setup that had not landed (only a setup that did not wait
  // for them leaves any) land now, as a late DMA would.
  mem_->Land();
  return res;
}

}  // namespace jax_blink
