// CUDA IPC between the processes of one host; see cuda_ipc.h.
#include "cuda/cuda_ipc.h"

#include <cuda.h>  // types only: the driver entry point is found at run time
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/cuda_transport.h"

namespace jax_blink {
namespace {

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange, looked up through the runtime (the module does not
// link libcuda, so importing it needs no driver).
Status AddressRange(const void* ptr, CUdeviceptr* base, size_t* size) {
  static AddressRangeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<AddressRangeFn>(p);
  }();
  if (fn == nullptr) {
    return Status::Internal("jax_blink CUDA IPC: the driver has no cuMemGetAddressRange");
  }
  const CUresult r = fn(base, size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) {
    return Status::InvalidArgument("jax_blink CUDA IPC: " +
                                   std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                                   " is not device memory (cuMemGetAddressRange error " +
                                   std::to_string(static_cast<int>(r)) + ")");
  }
  return Status();
}

struct Opened {
  std::mutex mu;
  std::map<std::pair<int64_t, std::string>, char*> buffers;          // (pid, handle) -> base
  std::map<std::pair<int64_t, std::string>, cudaEvent_t> events;     // (pid, handle) -> event
};

Opened& Peers() {
  static Opened* o = new Opened();  // leaked: closed by CloseIpcPeers, not at exit
  return *o;
}

std::string HandleKey(const uint8_t* handle) {
  return std::string(reinterpret_cast<const char*>(handle), kIpcHandleBytes);
}

// What `cache` holds for the handle `handle` of process `pid`, opened (with
// `open(handle, &value)`, a CUDA call) and kept on first use, under the lock
// of Peers(); `what` names it in the error.
template <class Handle, class Value, class Open>
Status OpenCached(std::map<std::pair<int64_t, std::string>, Value>& cache, int64_t pid,
                  const uint8_t* handle, const std::string& what, Open&& open, Value* value) {
  const auto key = std::make_pair(pid, HandleKey(handle));
  auto it = cache.find(key);
  if (it == cache.end()) {
    Handle h;
    std::memcpy(&h, handle, kIpcHandleBytes);
    Value opened{};
    const cudaError_t e = open(h, &opened);
    if (e != cudaSuccess) {
      return Status::Internal(CudaErrorText(("jax_blink CUDA IPC: cannot open " + what).c_str(), e));
    }
    it = cache.emplace(key, opened).first;
  }
  *value = it->second;
  return Status();
}

Status FromPeer(const IpcRankRecord& peer, int64_t rank) {
  if (peer.pid == static_cast<int64_t>(getpid())) {
    return Status::InvalidArgument("jax_blink CUDA IPC: rank " + std::to_string(rank) +
                                   " is in this process: its buffers are read directly, not "
                                   "opened");
  }
  return Status();
}

}  // namespace

Status FillIpcIdentity(IpcRankRecord* record) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  cudaDeviceProp prop;
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return Status::Internal(CudaErrorText("jax_blink CUDA IPC: device", e));
  record->pid = static_cast<int64_t>(getpid());
  static_assert(sizeof(prop.uuid.bytes) == sizeof(record->device_uuid), "UUID size");
  std::memcpy(record->device_uuid, prop.uuid.bytes, sizeof(record->device_uuid));
  return Status();
}

Status ExportIpcBuffer(const void* ptr, int64_t bytes, IpcRankRecord* record) {
  if (record->num_buffers >= kIpcMaxBuffers) {
    return Status::InvalidArgument("jax_blink CUDA IPC: a record holds at most " +
                                   std::to_string(kIpcMaxBuffers) + " buffers");
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  Status found = AddressRange(ptr, &base, &size);
  if (!found.ok()) return found;
  IpcBufferRecord& buf = record->buffers[record->num_buffers];
  buf.offset = static_cast<int64_t>(reinterpret_cast<CUdeviceptr>(ptr) - base);
  buf.bytes = bytes;
  buf.alloc_bytes = static_cast<int64_t>(size);
  if (bytes < 0 || buf.offset + bytes > buf.alloc_bytes) {
    return Status::InvalidArgument("jax_blink CUDA IPC: a buffer of " + std::to_string(bytes) +
                                   " bytes runs past its allocation");
  }
  cudaIpcMemHandle_t handle;
  const cudaError_t e = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
  if (e != cudaSuccess) {
    return Status::Internal(CudaErrorText(
        "jax_blink CUDA IPC: the allocation holding the buffer cannot be shared "
        "(cudaIpcGetMemHandle; memory of the virtual memory API needs a shareable handle type)",
        e));
  }
  static_assert(sizeof(handle) == kIpcHandleBytes, "cudaIpcMemHandle_t size");
  std::memcpy(buf.handle, &handle, kIpcHandleBytes);
  ++record->num_buffers;
  return Status();
}

Status ExportIpcEventHandle(cudaEvent_t event, uint8_t* out) {
  cudaIpcEventHandle_t handle;
  const cudaError_t e = cudaIpcGetEventHandle(&handle, event);
  if (e != cudaSuccess) {
    return Status::Internal(CudaErrorText(
        "jax_blink CUDA IPC: cudaIpcGetEventHandle (the event needs cudaEventInterprocess | "
        "cudaEventDisableTiming)", e));
  }
  static_assert(sizeof(handle) == kIpcHandleBytes, "cudaIpcEventHandle_t size");
  std::memcpy(out, &handle, kIpcHandleBytes);
  return Status();
}

Status ExportIpcEvent(cudaEvent_t event, IpcRankRecord* record) {
  Status st = ExportIpcEventHandle(event, record->event);
  if (st.ok()) record->has_event = 1;
  return st;
}

Status OpenIpcBuffer(const IpcRankRecord& peer, int32_t index, int64_t rank, void** ptr) {
  Status from = FromPeer(peer, rank);
  if (!from.ok()) return from;
  if (index < 0 || index >= peer.num_buffers) {
    return Status::InvalidArgument("jax_blink CUDA IPC: rank " + std::to_string(rank) +
                                   " published " + std::to_string(peer.num_buffers) +
                                   " buffers, not buffer " + std::to_string(index));
  }
  const IpcBufferRecord& buf = peer.buffers[index];
  Opened& o = Peers();
  std::lock_guard<std::mutex> lk(o.mu);
  char* base = nullptr;
  Status opened = OpenCached<cudaIpcMemHandle_t>(
      o.buffers, peer.pid, buf.handle,
      "a buffer of rank " + std::to_string(rank) + " (process " + std::to_string(peer.pid) + ")",
      [](cudaIpcMemHandle_t h, char** p) {
        void* v = nullptr;
        const cudaError_t e = cudaIpcOpenMemHandle(&v, h, cudaIpcMemLazyEnablePeerAccess);
        *p = static_cast<char*>(v);
        return e;
      },
      &base);
  if (!opened.ok()) return opened;
  *ptr = base + buf.offset;
  return Status();
}

Status OpenIpcEventHandle(const IpcRankRecord& peer, const uint8_t* handle, int64_t rank,
                          cudaEvent_t* event) {
  Status from = FromPeer(peer, rank);
  if (!from.ok()) return from;
  Opened& o = Peers();
  std::lock_guard<std::mutex> lk(o.mu);
  return OpenCached<cudaIpcEventHandle_t>(
      o.events, peer.pid, handle, "an event of rank " + std::to_string(rank),
      [](cudaIpcEventHandle_t h, cudaEvent_t* ev) { return cudaIpcOpenEventHandle(ev, h); }, event);
}

Status OpenIpcEvent(const IpcRankRecord& peer, int64_t rank, cudaEvent_t* event) {
  if (!peer.has_event) {
    return Status::InvalidArgument("jax_blink CUDA IPC: rank " + std::to_string(rank) +
                                   " published no event");
  }
  return OpenIpcEventHandle(peer, peer.event, rank, event);
}

void CloseIpcPeers() {
  Opened& o = Peers();
  std::lock_guard<std::mutex> lk(o.mu);
  for (auto& [key, base] : o.buffers) cudaIpcCloseMemHandle(base);
  for (auto& [key, event] : o.events) cudaEventDestroy(event);
  o.buffers.clear();
  o.events.clear();
}

}  // namespace jax_blink
