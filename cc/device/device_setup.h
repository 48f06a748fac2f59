// The device executor's state in device memory, set up once per executor and
// written once for both builds, over a memory backend (CUDA in
// device_kernel.cu; the host build's emulated device memory in
// testing/device_host.cc):
//   * the program on each distinct device of the ranks: a DeviceProgramHeader
//     naming the executor, then the program's arrays (16-byte aligned);
//   * each rank's step flags on its device, and the call's control words on
//     rank 0's device, all zero (no generation yet).
//
// The kernels that read this state run on the callers' streams, which XLA
// creates non-blocking: they do not wait for the legacy default stream, a
// pageable copy may return before its DMA lands, and a memset is
// asynchronous to the host. So every write here is issued asynchronously on
// the backend's own streams and SetUpDeviceState ends with Finish(), which
// waits for all of them, once per executor: a kernel launched after it
// returns reads the whole program and zeroed flags. Memory from an earlier
// allocation holds stale flags (generations of another executor's calls,
// which would let a wait pass early) and possibly an earlier program; the
// header check in the kernel's prologue (device_interp.h) turns a program
// that is not this executor's into an error.
//
// Mem, the backend:
//   std::string Alloc(int device, size_t bytes, void** p);
//   void Free(int device, void* p);
//   // Asynchronous; `src` is read at the call (pageable memory is staged).
//   std::string Upload(int device, void* dst, const void* src, size_t bytes);
//   std::string Zero(int device, void* dst, size_t bytes);  // asynchronous
//   std::string Finish();  // every Upload and Zero issued so far has landed
#ifndef JAX_BLINK_CC_DEVICE_DEVICE_SETUP_H_
#define JAX_BLINK_CC_DEVICE_DEVICE_SETUP_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "device/device_program.h"

namespace jax_blink {

// An executor's state in device memory (pointers the backend allocated).
struct DeviceState {
  uint64_t executor = 0;  // the id in its programs' headers
  struct OnDevice {       // the program on one device
    int device = -1;
    void* blob = nullptr;
    DeviceProgramView view{};
  };
  std::vector<OnDevice> on_device;
  std::vector<int> view_of_rank;   // index into on_device
  std::vector<int> device_of_rank;
  std::vector<uint64_t*> flags;    // per rank, on its device
  uint64_t* control = nullptr;     // on rank 0's device
};

namespace device_setup_detail {

// Appends `v`'s bytes to `blob` at a 16-byte aligned offset; returns it.
template <typename T>
size_t Append(std::vector<unsigned char>* blob, const T* v, size_t n) {
  const size_t at = (blob->size() + 15) / 16 * 16;
  blob->resize(at + n * sizeof(T));
  if (n > 0) std::memcpy(blob->data() + at, v, n * sizeof(T));
  return at;
}

}  // namespace device_setup_detail

// Frees what SetUpDeviceState allocated (after every kernel reading it is
// over); leaves `st` empty.
template <class Mem>
void FreeDeviceState(Mem& mem, DeviceState* st) {
  for (DeviceState::OnDevice& od : st->on_device) {
    if (od.blob != nullptr) mem.Free(od.device, od.blob);
  }
  for (size_t r = 0; r < st->flags.size(); ++r) {
    if (st->flags[r] != nullptr) mem.Free(st->device_of_rank[r], st->flags[r]);
  }
  if (st->control != nullptr) mem.Free(st->device_of_rank[0], st->control);
  *st = DeviceState();
}

// Allocates and fills the state of program `p` over the ranks' `devices`
// (one per rank). Returns "" or the backend's error; on an error, what was
// allocated is in `out` (FreeDeviceState frees it) and nothing is pending.
template <class Mem>
std::string SetUpDeviceState(const DeviceProgram& p, const std::vector<int>& devices,
                             uint64_t executor, Mem& mem, DeviceState* out) {
  using device_setup_detail::Append;
  DeviceState& st = *out;
  st = DeviceState();
  st.executor = executor;
  st.device_of_rank = devices;
  std::vector<unsigned char> blob;
  const DeviceProgramHeader header{kDeviceProgramMagic, executor};
  const size_t at_header = Append(&blob, &header, 1);
  const size_t at_ranks = Append(&blob, p.ranks.data(), p.ranks.size());
  const size_t at_blocks = Append(&blob, p.blocks.data(), p.blocks.size());
  const size_t at_instrs = Append(&blob, p.instrs.data(), p.instrs.size());
  const size_t at_waits = Append(&blob, p.waits.data(), p.waits.size());
  const size_t at_copies = Append(&blob, p.copies.data(), p.copies.size());
  std::string err;
  // The program, once per distinct device.
  st.view_of_rank.assign(p.nranks, -1);
  for (int64_t r = 0; r < p.nranks && err.empty(); ++r) {
    size_t k = 0;
    while (k < st.on_device.size() && st.on_device[k].device != devices[r]) ++k;
    if (k == st.on_device.size()) {
      DeviceState::OnDevice od;
      od.device = devices[r];
      err = mem.Alloc(od.device, blob.size(), &od.blob);
      if (!err.empty()) break;
      st.on_device.push_back(od);
      err = mem.Upload(od.device, od.blob, blob.data(), blob.size());
      const auto* base = static_cast<const unsigned char*>(od.blob);
      DeviceProgramView& v = st.on_device.back().view;
      v.nranks = p.nranks;
      v.max_blocks = p.max_blocks;
      v.dtype = static_cast<uint8_t>(p.dtype);
      v.op = static_cast<uint8_t>(p.op);
      v.acc_is_out = static_cast<uint8_t>(p.acc_is_out);
      v.header = reinterpret_cast<const DeviceProgramHeader*>(base + at_header);
      v.ranks = reinterpret_cast<const DeviceRank*>(base + at_ranks);
      v.blocks = reinterpret_cast<const DeviceBlock*>(base + at_blocks);
      v.instrs = reinterpret_cast<const DeviceInstr*>(base + at_instrs);
      v.waits = reinterpret_cast<const DeviceWait*>(base + at_waits);
      v.copies = reinterpret_cast<const DeviceCopy*>(base + at_copies);
    }
    st.view_of_rank[r] = static_cast<int>(k);
  }
  // Flags and control words: zero, no generation yet.
  st.flags.assign(p.nranks, nullptr);
  for (int64_t r = 0; r < p.nranks && err.empty(); ++r) {
    const size_t bytes = std::max<size_t>(p.ranks[r].nsteps, 1) * sizeof(uint64_t);
    void* f = nullptr;
    err = mem.Alloc(devices[r], bytes, &f);
    if (!err.empty()) break;
    st.flags[r] = static_cast<uint64_t*>(f);
    err = mem.Zero(devices[r], f, bytes);
  }
  if (err.empty()) {
    const size_t bytes = DeviceControlWords(p.nranks, p.max_blocks) * sizeof(uint64_t);
    void* c = nullptr;
    err = mem.Alloc(devices[0], bytes, &c);
    if (err.empty()) {
      st.control = static_cast<uint64_t*>(c);
      err = mem.Zero(devices[0], c, bytes);
    }
  }
  // Before any kernel can read it (and before an error frees it).
  const std::string finished = mem.Finish();
  return err.empty() ? finished : err;
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_DEVICE_DEVICE_SETUP_H_
