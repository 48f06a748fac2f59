// CUDA IPC for ranks in different processes of one host: what a rank
// publishes so that its peers can open its device buffers and wait on its
// event (the record of sync/ipc_record.h, exchanged through the host
// transport's rendezvous), and opening what peers published.
//
// XLA sub-allocates buffers from large allocations, so a buffer travels as
// the IPC handle of the allocation holding it (cudaIpcGetMemHandle on the
// allocation's base, found with the driver's cuMemGetAddressRange) and its
// offset there. A peer opens each allocation once per process and keeps it
// open until CloseIpcPeers(). Allocations made through the virtual memory
// API (cuMemCreate without a shareable handle type) cannot be exported:
// ExportIpcBuffer then returns an Internal error saying so, and the
// caller uses another path.
//
// No function aborts: each returns a Status naming the rank and the CUDA
// error.
#ifndef JAX_BLINK_CC_CUDA_CUDA_IPC_H_
#define JAX_BLINK_CC_CUDA_CUDA_IPC_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "sync/ipc_record.h"

namespace jax_blink {

// This process's pid and the current device's UUID, into `record`.
Status FillIpcIdentity(IpcRankRecord* record);

// Appends the device buffer [ptr, ptr + bytes) to `record`'s buffers.
Status ExportIpcBuffer(const void* ptr, int64_t bytes, IpcRankRecord* record);

// The IPC handle of `event` (made with cudaEventInterprocess |
// cudaEventDisableTiming), kIpcHandleBytes bytes into `handle`.
Status ExportIpcEventHandle(cudaEvent_t event, uint8_t* handle);

// Puts the IPC handle of `event` into `record`.
Status ExportIpcEvent(cudaEvent_t event, IpcRankRecord* record);

// Buffer `index` of the record `rank` published, as a device pointer in this
// process. InvalidArgument when the record comes from this process (its
// buffers are read directly) or has no such buffer.
Status OpenIpcBuffer(const IpcRankRecord& peer, int32_t index, int64_t rank, void** ptr);

// The event of the record `rank` published, opened here (cached).
Status OpenIpcEvent(const IpcRankRecord& peer, int64_t rank, cudaEvent_t* event);

// Another event handle of the process that published `peer` (rank `rank`),
// opened here (cached; closed by CloseIpcPeers).
Status OpenIpcEventHandle(const IpcRankRecord& peer, const uint8_t* handle, int64_t rank,
                          cudaEvent_t* event);

// Closes every allocation and event this process opened.
void CloseIpcPeers();

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CUDA_CUDA_IPC_H_
