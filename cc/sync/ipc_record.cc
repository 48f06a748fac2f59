// The IPC record's encoding; see ipc_record.h.
#include "sync/ipc_record.h"

#include <cstring>

#include "sync/host_rendezvous.h"

namespace jax_blink {
namespace {

constexpr uint64_t kIpcMagic = 0x6a62697063726563ull;  // "jbipcrec"
constexpr uint32_t kIpcVersion = 1;

struct Encoded {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  IpcRankRecord record;
};
static_assert(sizeof(Encoded) <= kHostBlobBytes, "an IPC record must fit in a host blob");
// No padding anywhere, so the encoding holds no stray bytes.
static_assert(sizeof(IpcBufferRecord) == kIpcHandleBytes + 3 * 8, "IpcBufferRecord layout");
static_assert(sizeof(IpcRankRecord) == 8 + 16 + 4 + kIpcHandleBytes + 4 + kIpcMaxBuffers * sizeof(IpcBufferRecord),
              "IpcRankRecord layout");
static_assert(sizeof(Encoded) == 16 + sizeof(IpcRankRecord), "Encoded layout");

}  // namespace

std::string EncodeIpcRecord(const IpcRankRecord& record) {
  Encoded e;
  e.magic = kIpcMagic;
  e.version = kIpcVersion;
  e.size = sizeof(Encoded);
  e.record = record;
  return std::string(reinterpret_cast<const char*>(&e), sizeof(e));
}

Status DecodeIpcRecord(const std::string& bytes, int64_t rank, IpcRankRecord* record) {
  const std::string who = "jax_blink CUDA IPC: the record of rank " + std::to_string(rank);
  if (bytes.size() != sizeof(Encoded)) {
    return Status::InvalidArgument(who + " has " + std::to_string(bytes.size()) +
                                   " bytes, not " + std::to_string(sizeof(Encoded)) +
                                   " (did it publish one? all processes must run the same "
                                   "jax_blink build)");
  }
  Encoded e;
  std::memcpy(&e, bytes.data(), sizeof(e));
  if (e.magic != kIpcMagic || e.version != kIpcVersion || e.size != sizeof(Encoded)) {
    return Status::InvalidArgument(who + " is not a version-" + std::to_string(kIpcVersion) +
                                   " jax_blink IPC record (all processes must run the same "
                                   "jax_blink build)");
  }
  const IpcRankRecord& r = e.record;
  if (r.num_buffers < 0 || r.num_buffers > kIpcMaxBuffers || r.pid <= 0) {
    return Status::InvalidArgument(who + " names " + std::to_string(r.num_buffers) +
                                   " buffers of process " + std::to_string(r.pid) +
                                   " (at most " + std::to_string(kIpcMaxBuffers) + " buffers)");
  }
  for (int32_t b = 0; b < r.num_buffers; ++b) {
    const IpcBufferRecord& buf = r.buffers[b];
    if (buf.offset < 0 || buf.bytes < 0 || buf.alloc_bytes < 0 ||
        buf.offset > buf.alloc_bytes || buf.bytes > buf.alloc_bytes - buf.offset) {
      return Status::InvalidArgument(
          who + ": buffer " + std::to_string(b) + " (" + std::to_string(buf.bytes) +
          " bytes at offset " + std::to_string(buf.offset) + ") does not lie in its allocation of " +
          std::to_string(buf.alloc_bytes) + " bytes");
    }
  }
  *record = r;
  return Status();
}

}  // namespace jax_blink
