// What a rank of one process tells the ranks of the other processes of its
// host about its device buffers, so that they can open them (CUDA IPC): for
// each buffer the IPC handle of the allocation holding it, the buffer's
// offset in that allocation and its size, plus the rank's process, its GPU
// (by UUID) and the IPC handle of an event its peers may wait on.
//
// Plain bytes, no CUDA header: the record travels through the host
// transport's rendezvous (HostRankArgs::blob, sync/host_rendezvous.h) and is
// encoded, exchanged and checked on machines without a GPU; only making
// and opening the handles needs CUDA (cuda/cuda_ipc.h).
#ifndef JAX_BLINK_CC_SYNC_IPC_RECORD_H_
#define JAX_BLINK_CC_SYNC_IPC_RECORD_H_

#include <cstdint>
#include <string>

#include "core/status.h"

namespace jax_blink {

inline constexpr int64_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t, cudaIpcEventHandle_t
inline constexpr int64_t kIpcMaxBuffers = 4;

struct IpcBufferRecord {
  uint8_t handle[kIpcHandleBytes] = {};
  int64_t offset = 0;       // of the buffer in its allocation
  int64_t bytes = 0;        // of the buffer
  int64_t alloc_bytes = 0;  // of the allocation the handle opens
};

struct IpcRankRecord {
  int64_t pid = 0;             // the process that made the handles (it cannot open them)
  uint8_t device_uuid[16] = {};
  int32_t has_event = 0;
  uint8_t event[kIpcHandleBytes] = {};
  int32_t num_buffers = 0;
  IpcBufferRecord buffers[kIpcMaxBuffers];
};

// The record as bytes for HostRankArgs::blob (under kHostBlobBytes).
std::string EncodeIpcRecord(const IpcRankRecord& record);

// The record `rank` published, checked: its size, format and version, and
// that each buffer lies inside its allocation. InvalidArgument naming the
// rank and what is wrong otherwise (a peer of another jax_blink build, or
// memory overwritten).
Status DecodeIpcRecord(const std::string& bytes, int64_t rank, IpcRankRecord* record);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_SYNC_IPC_RECORD_H_
