// Host emulator of StreamTransport with a happens-before race checker. See
// stream_emulator.h for the model.
#include "testing/stream_emulator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_set>
#include <type_traits>
#include <utility>

#include "core/half.h"
#include "core/reduce_op.h"

namespace jax_blink {

namespace {

enum class Kind : uint8_t {
  kCopy,
  kReduce,
  kToAcc,
  kFinalize,
  kRecord,
  kWait,
  kTouch,
};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kCopy: return "Copy";
    case Kind::kReduce: return "Reduce";
    case Kind::kToAcc: return "ToAcc";
    case Kind::kFinalize: return "Finalize";
    case Kind::kRecord: return "Record";
    case Kind::kWait: return "Wait";
    case Kind::kTouch: return "Touch";
  }
  return "?";
}

bool ValidDType(DType d) { return static_cast<int>(d) < kNumDTypes; }

// ---- Host kernels: the CUDA kernels' arithmetic, element by element.
// Loads and stores go through memcpy: chunk offsets keep elements aligned,
// but nothing here should depend on it. Every element is read before it is
// written, so base == dst (in place) is fine.

template <typename X>
X LoadAt(const void* p, int64_t i) {
  X x;
  std::memcpy(&x, static_cast<const char*>(p) + i * sizeof(X), sizeof(X));
  return x;
}
template <typename X>
void StoreAt(void* p, int64_t i, X x) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(X), &x, sizeof(X));
}

// dst = op(op(ops[0], ops[1]), ...) left to right in A (core/reduce_op.h:
// the CUDA kernels' and the CPU executor's Combine).
template <ReduceOp kOp, typename A>
void ReduceSame(void* dst, const std::vector<StreamOperand>& ops, int64_t n) {
  // A sum starting from an input starts from +0 (the CUDA kernel's rule).
  const bool zero =
      kOp == ReduceOp::kSum && std::is_floating_point<A>::value && ops[0].is_input;
  for (int64_t i = 0; i < n; ++i) {
    A acc = LoadAt<A>(ops[0].p, i);
    if (zero) acc = A(0) + acc;
    for (size_t j = 1; j < ops.size(); ++j) acc = Combine<kOp, A>(acc, LoadAt<A>(ops[j].p, i));
    StoreAt<A>(dst, i, acc);
  }
}

// An f16/bf16 operand: the buffer type (is_input) or the float accumulator.
template <float (*Widen)(uint16_t)>
float LoadWide(const StreamOperand& op, int64_t i) {
  return op.is_input ? Widen(LoadAt<uint16_t>(op.p, i)) : LoadAt<float>(op.p, i);
}

// The same in float32 (the CUDA kernel's order).
template <ReduceOp kOp, float (*Widen)(uint16_t)>
void ReduceHalf(void* dst, const std::vector<StreamOperand>& ops, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = LoadWide<Widen>(ops[0], i);
    if (kOp == ReduceOp::kSum && ops[0].is_input) acc = 0.0f + acc;
    for (size_t j = 1; j < ops.size(); ++j) acc = Combine<kOp, float>(acc, LoadWide<Widen>(ops[j], i));
    StoreAt<float>(dst, i, acc);
  }
}

template <ReduceOp kOp>
void HostReduceOp(DType d, void* dst, const std::vector<StreamOperand>& ops, int64_t n) {
  switch (d) {
    case DType::kF32: return ReduceSame<kOp, float>(dst, ops, n);
    case DType::kF64: return ReduceSame<kOp, double>(dst, ops, n);
    case DType::kF16: return ReduceHalf<kOp, HalfToFloat>(dst, ops, n);
    case DType::kBF16: return ReduceHalf<kOp, BF16ToFloat>(dst, ops, n);
    case DType::kI32: return ReduceSame<kOp, int32_t>(dst, ops, n);
    case DType::kU32: return ReduceSame<kOp, uint32_t>(dst, ops, n);
    case DType::kI64: return ReduceSame<kOp, int64_t>(dst, ops, n);
  }
}

void HostReduce(DType d, ReduceOp op, void* dst, const std::vector<StreamOperand>& ops,
                int64_t n) {
  switch (op) {
    case ReduceOp::kSum: return HostReduceOp<ReduceOp::kSum>(d, dst, ops, n);
    case ReduceOp::kMax: return HostReduceOp<ReduceOp::kMax>(d, dst, ops, n);
    case ReduceOp::kMin: return HostReduceOp<ReduceOp::kMin>(d, dst, ops, n);
  }
}

void HostToAcc(DType d, void* dst, const void* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = LoadAt<uint16_t>(src, i);
    StoreAt<float>(dst, i, d == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h));
  }
}

void HostFinalize(DType d, void* out, const void* acc, int64_t n) {
  if (d == DType::kF16 || d == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      const float f = LoadAt<float>(acc, i);
      StoreAt<uint16_t>(out, i,
                        d == DType::kF16 ? FloatToHalf(f) : FloatToBF16(f));
    }
  } else if (out != acc) {
    std::memmove(out, acc, static_cast<size_t>(n) * DTypeSize(d));
  }
}

// ---- Emulated objects.

// Memory ops may touch: an allocation or a labelled caller buffer.
struct Region {
  uintptr_t begin = 0;
  size_t bytes = 0;
  int device = -1;           // -1: host memory, any device may touch it
  int64_t alloc_index = -1;  // allocations: #k in Alloc order; labels: -1
  std::string name;          // labels
  bool live = true;
};

// One byte range an op reads or writes, relative to its region.
struct Access {
  int32_t region = -1;
  int32_t op = -1;
  uint64_t lo = 0, hi = 0;
  bool write = false;
};

struct OpRec {
  Kind kind = Kind::kTouch;
  bool executed = false;
  StreamId stream = -1;
  int32_t pos = 0;     // the op's own component of its clock
  int32_t bound = -1;  // wait: the record op it waits for (-1: none)
  int64_t clock = -1;  // offset of its clock in Impl::clocks (-1: not kept)
  int32_t clock_len = 0;
  int32_t acc_begin = 0, acc_end = 0;  // its Accesses
  int64_t seq = 0;                     // issue number since construction
  // Work.
  ReduceOp reduce_op = ReduceOp::kSum;  // Reduce
  DType dtype = DType::kF32;
  void* dst = nullptr;
  const void* a = nullptr;  // Copy/ToAcc: src; Finalize: acc
  std::vector<StreamOperand> operands;  // Reduce
  int64_t n = 0;     // elements
  size_t bytes = 0;  // Copy
  std::string label;
  std::function<void()> fn;
};

struct Stream {
  int device = 0;
  bool live = true;
  std::string name;
  std::deque<int32_t> queue;   // op indices, FIFO
  std::vector<int32_t> clock;  // after its last issued op
  int32_t pos = 0;             // ops issued on it
};

struct Event {
  int device = 0;
  bool live = true;
  int32_t latest = -1;  // op index of the latest Record (-1: none)
};

// A requested access before it is resolved to a region.
struct Want {
  const void* p;
  size_t bytes;
  bool write;
};

}  // namespace

struct StreamEmulator::Impl {
  std::mutex mu;  // every public method holds it
  std::vector<Stream> streams;
  std::vector<Event> events;
  std::vector<Region> regions;
  std::map<uintptr_t, int32_t> live;  // begin -> region, live regions only
  std::vector<void*> owned;           // every allocation's memory
  std::vector<void*> pending_free;    // retired, released after Run
  std::map<std::pair<int, int>, bool> peer;  // SetPeerAccess
  std::map<std::pair<int, int>, bool> enabled;
  int64_t nallocs = 0;

  std::vector<OpRec> ops;  // since Reset
  std::vector<Access> accesses;
  std::vector<int32_t> clocks;  // flattened vector clocks of kept ops
  int64_t seq_base = 0;         // seq of ops[0]
  int32_t checked = 0;          // ops before this were checked already
  std::vector<std::string> misuse;

  std::vector<std::string> races;
  StreamEmulatorStats stats;

  ~Impl() {
    for (void* p : owned) std::free(p);
  }

  std::string StreamText(StreamId s) const {
    std::ostringstream os;
    os << "stream " << s;
    if (!streams[s].name.empty()) os << " '" << streams[s].name << "'";
    os << " (dev " << streams[s].device << ")";
    return os.str();
  }

  std::string RegionText(int32_t r) const {
    const Region& g = regions[r];
    if (g.alloc_index < 0) return g.name;
    return "alloc#" + std::to_string(g.alloc_index) + "(dev " +
           std::to_string(g.device) + ")";
  }

  std::string AccessText(const Access& x) const {
    std::ostringstream os;
    os << (x.write ? "W " : "R ") << RegionText(x.region) << " [" << x.lo
       << ", " << x.hi << ")";
    return os.str();
  }

  std::string OpText(int32_t i) const {
    const OpRec& op = ops[i];
    std::ostringstream os;
    os << KindName(op.kind) << "#" << op.seq;
    if (!op.label.empty()) os << " '" << op.label << "'";
    os << " on " << StreamText(op.stream) << " {";
    for (int32_t k = op.acc_begin; k < op.acc_end; ++k) {
      os << (k > op.acc_begin ? ", " : "") << AccessText(accesses[k]);
    }
    os << "}";
    return os.str();
  }

  std::string CheckStream(StreamId s, const char* what) const {
    if (s < 0 || s >= static_cast<StreamId>(streams.size())) {
      return std::string("stream emulator: ") + what + ": unknown stream " +
             std::to_string(s);
    }
    if (!streams[s].live) {
      return std::string("stream emulator: ") + what + ": stream " +
             std::to_string(s) + " was destroyed";
    }
    return std::string();
  }

  std::string CheckEvent(EventId e, const char* what) const {
    if (e < 0 || e >= static_cast<EventId>(events.size())) {
      return std::string("stream emulator: ") + what + ": unknown event " +
             std::to_string(e);
    }
    if (!events[e].live) {
      return std::string("stream emulator: ") + what + ": event " +
             std::to_string(e) + " was destroyed";
    }
    return std::string();
  }

  bool Enabled(int reader, int owner) const {
    if (reader == owner) return true;
    auto it = enabled.find({reader, owner});
    return it != enabled.end() && it->second;
  }

  // The live region holding [p, p + bytes), or an error.
  std::string Resolve(const void* p, size_t bytes, int32_t* region,
                      uint64_t* off) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = live.upper_bound(a);
    if (it != live.begin()) {
      --it;
      const Region& g = regions[it->second];
      if (a >= g.begin && a - g.begin < g.bytes &&
          bytes <= g.bytes - (a - g.begin)) {
        *region = it->second;
        *off = a - g.begin;
        return std::string();
      }
      if (a >= g.begin && a - g.begin < g.bytes) {
        std::ostringstream os;
        os << bytes << " bytes at " << RegionText(it->second) << "+"
           << (a - g.begin) << " run past its end (" << g.bytes << " bytes)";
        return os.str();
      }
    }
    std::ostringstream os;
    os << bytes << " bytes at " << p
       << " are in no allocation or labelled buffer";
    return os.str();
  }

  // Appends an op to its stream: resolves and checks its accesses (nothing
  // changes on an error), computes its vector clock and queues it.
  // `kernel`: the accesses are made by a kernel on the stream's device (so
  // other devices' memory needs peer access).
  std::string Issue(OpRec op, const std::vector<Want>& wants, bool kernel) {
    Stream& st = streams[op.stream];
    std::vector<Access> resolved;
    resolved.reserve(wants.size());
    for (const Want& w : wants) {
      if (w.bytes == 0) continue;
      Access x;
      x.write = w.write;
      std::string err = Resolve(w.p, w.bytes, &x.region, &x.lo);
      if (!err.empty()) {
        return std::string("stream emulator: ") + KindName(op.kind) + " on " +
               StreamText(op.stream) + ": " + err;
      }
      x.hi = x.lo + w.bytes;
      const Region& g = regions[x.region];
      if (kernel && g.device >= 0 && !Enabled(st.device, g.device)) {
        return std::string("stream emulator: ") + KindName(op.kind) + " on " +
               StreamText(op.stream) + " " + (w.write ? "writes" : "reads") +
               " " + RegionText(x.region) + " of device " +
               std::to_string(g.device) +
               " without peer access (PeerReadable(" +
               std::to_string(st.device) + ", " + std::to_string(g.device) +
               ") never returned true)";
      }
      resolved.push_back(x);
    }
    const int32_t id = static_cast<int32_t>(ops.size());
    if (st.clock.size() < streams.size()) st.clock.resize(streams.size(), 0);
    if (op.kind == Kind::kWait && op.bound >= 0) {
      const OpRec& rec = ops[op.bound];
      for (int32_t k = 0; k < rec.clock_len; ++k) {
        st.clock[k] = std::max(st.clock[k], clocks[rec.clock + k]);
      }
    }
    op.pos = ++st.pos;
    st.clock[op.stream] = op.pos;
    if (!resolved.empty() || op.kind == Kind::kRecord) {
      op.clock = static_cast<int64_t>(clocks.size());
      op.clock_len = static_cast<int32_t>(st.clock.size());
      clocks.insert(clocks.end(), st.clock.begin(), st.clock.end());
    }
    op.acc_begin = static_cast<int32_t>(accesses.size());
    for (Access& x : resolved) {
      x.op = id;
      accesses.push_back(x);
    }
    op.acc_end = static_cast<int32_t>(accesses.size());
    stats.accesses += static_cast<int64_t>(resolved.size());
    op.seq = seq_base + id;
    switch (op.kind) {
      case Kind::kCopy: ++stats.copies; break;
      case Kind::kReduce: ++stats.reduces; break;
      case Kind::kToAcc: ++stats.to_accs; break;
      case Kind::kFinalize: ++stats.finalizes; break;
      case Kind::kRecord: ++stats.records; break;
      case Kind::kWait:
        ++stats.waits;
        if (op.bound < 0) ++stats.noop_waits;
        break;
      case Kind::kTouch: ++stats.touches; break;
    }
    ops.push_back(std::move(op));
    st.queue.push_back(id);
    return std::string();
  }

  // The region of an operand (for device checks of copies), or -1.
  int DeviceOf(const void* p, size_t bytes) const {
    int32_t r;
    uint64_t off;
    if (bytes == 0 || !Resolve(p, bytes, &r, &off).empty()) return -1;
    return regions[r].device;
  }

  bool Runnable(const OpRec& op) const {
    return op.kind != Kind::kWait || op.bound < 0 || ops[op.bound].executed;
  }

  void Execute(OpRec& op) {
    switch (op.kind) {
      case Kind::kCopy:
        std::memmove(op.dst, op.a, op.bytes);
        break;
      case Kind::kReduce:
        HostReduce(op.dtype, op.reduce_op, op.dst, op.operands, op.n);
        break;
      case Kind::kToAcc:
        HostToAcc(op.dtype, op.dst, op.a, op.n);
        break;
      case Kind::kFinalize:
        HostFinalize(op.dtype, op.dst, op.a, op.n);
        break;
      case Kind::kTouch:
        if (op.fn) op.fn();
        op.fn = nullptr;  // may hold copies of the caller's data
        break;
      case Kind::kRecord:
      case Kind::kWait:
        break;
    }
    op.executed = true;
    ++stats.executed;
  }

  // Whether op a happens before op b.
  bool Before(int32_t a, int32_t b) const {
    const OpRec& A = ops[a];
    const OpRec& B = ops[b];
    return A.stream < B.clock_len && clocks[B.clock + A.stream] >= A.pos;
  }

  void AddRace(int32_t a, int32_t b, const Access& xa, const Access& xb) {
    ++stats.races;
    if (races.size() >= kMaxReportedRaces) return;
    const uint64_t lo = std::max(xa.lo, xb.lo);
    const uint64_t hi = std::min(xa.hi, xb.hi);
    std::ostringstream os;
    os << "race: " << OpText(a) << " and " << OpText(b)
       << " are unordered; they overlap on " << RegionText(xa.region)
       << " bytes [" << lo << ", " << hi << ") (" << (hi - lo) << " bytes; "
       << (xa.write ? "write" : "read") << "/" << (xb.write ? "write" : "read")
       << ")";
    races.push_back(os.str());
  }

  // Compares every access of the ops issued since the last check with every
  // overlapping access since Reset: per region, sorted by start offset, a
  // sweep keeps the accesses still open at the current offset, so the work
  // is proportional to the number of overlapping pairs.
  void CheckRaces() {
    const int32_t first_new = checked;
    checked = static_cast<int32_t>(ops.size());
    if (first_new == checked) return;
    std::vector<int32_t> order(accesses.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t i, int32_t j) {
      const Access& x = accesses[i];
      const Access& y = accesses[j];
      if (x.region != y.region) return x.region < y.region;
      if (x.lo != y.lo) return x.lo < y.lo;
      return i < j;
    });
    std::unordered_set<uint64_t> seen;  // op pairs already reported
    std::vector<int32_t> open;
    int32_t region = -1;
    for (int32_t i : order) {
      const Access& x = accesses[i];
      if (x.region != region) {
        open.clear();
        region = x.region;
      }
      open.erase(std::remove_if(open.begin(), open.end(),
                                [&](int32_t j) {
                                  return accesses[j].hi <= x.lo;
                                }),
                 open.end());
      for (int32_t j : open) {
        const Access& y = accesses[j];
        if (!x.write && !y.write) continue;
        if (x.op < first_new && y.op < first_new) continue;
        const OpRec& X = ops[x.op];
        const OpRec& Y = ops[y.op];
        if (X.stream == Y.stream) continue;  // stream order
        if (Before(x.op, y.op) || Before(y.op, x.op)) continue;
        const int32_t a = std::min(x.op, y.op), b = std::max(x.op, y.op);
        const uint64_t key = (static_cast<uint64_t>(a) << 32) |
                             static_cast<uint32_t>(b);
        if (!seen.insert(key).second) continue;
        if (a == x.op) {
          AddRace(a, b, x, y);
        } else {
          AddRace(a, b, y, x);
        }
      }
      open.push_back(i);
    }
  }
};

StreamEmulator::StreamEmulator() : impl_(new Impl) {}
StreamEmulator::~StreamEmulator() = default;

std::string StreamEmulator::CreateStream(int device, StreamId* s) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (device < 0) {
    return "stream emulator: CreateStream: invalid device " +
           std::to_string(device);
  }
  Stream st;
  st.device = device;
  impl_->streams.push_back(std::move(st));
  *s = static_cast<StreamId>(impl_->streams.size() - 1);
  ++impl_->stats.streams;
  ++impl_->stats.live_streams;
  return std::string();
}

std::string StreamEmulator::CreateEvent(int device, EventId* e) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (device < 0) {
    return "stream emulator: CreateEvent: invalid device " +
           std::to_string(device);
  }
  Event ev;
  ev.device = device;
  impl_->events.push_back(ev);
  *e = static_cast<EventId>(impl_->events.size() - 1);
  ++impl_->stats.events;
  ++impl_->stats.live_events;
  return std::string();
}

// Work queued on a destroyed stream still runs (as with cudaStreamDestroy),
// and waits already bound to a destroyed event's record keep it.
void StreamEmulator::DestroyStream(StreamId s) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "DestroyStream");
  if (!err.empty()) {
    impl_->misuse.push_back(err);
    return;
  }
  impl_->streams[s].live = false;
  --impl_->stats.live_streams;
}

void StreamEmulator::DestroyEvent(EventId e) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckEvent(e, "DestroyEvent");
  if (!err.empty()) {
    impl_->misuse.push_back(err);
    return;
  }
  impl_->events[e].live = false;
  --impl_->stats.live_events;
}

std::string StreamEmulator::Alloc(int device, size_t bytes, void** p) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  *p = nullptr;
  if (device < 0) {
    return "stream emulator: Alloc: invalid device " + std::to_string(device);
  }
  const size_t cap = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* mem = std::aligned_alloc(64, cap);
  if (mem == nullptr) {
    return "stream emulator: Alloc: out of host memory (" +
           std::to_string(bytes) + " bytes)";
  }
  std::memset(mem, 0xff, cap);
  Region g;
  g.begin = reinterpret_cast<uintptr_t>(mem);
  g.bytes = bytes;
  g.device = device;
  g.alloc_index = impl_->nallocs++;
  // Fresh host memory cannot overlap a live allocation, but it can overlap
  // a labelled buffer that its owner freed without telling us.
  auto it = impl_->live.lower_bound(g.begin + cap);
  if (it != impl_->live.begin()) {
    const Region& prev = impl_->regions[std::prev(it)->second];
    if (prev.begin + prev.bytes > g.begin) {
      std::free(mem);
      return "stream emulator: Alloc: new memory overlaps " + prev.name +
             ", which is labelled but no longer allocated";
    }
  }
  impl_->regions.push_back(g);
  impl_->live[g.begin] = static_cast<int32_t>(impl_->regions.size() - 1);
  impl_->owned.push_back(mem);
  ++impl_->stats.allocs;
  impl_->stats.alloc_bytes += static_cast<int64_t>(bytes);
  *p = mem;
  return std::string();
}

void StreamEmulator::Free(int device, void* p) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (p == nullptr) return;
  auto it = impl_->live.find(reinterpret_cast<uintptr_t>(p));
  if (it == impl_->live.end() ||
      impl_->regions[it->second].alloc_index < 0) {
    std::ostringstream os;
    os << "stream emulator: Free of " << p
       << ", which is not a live allocation";
    impl_->misuse.push_back(os.str());
    return;
  }
  Region& g = impl_->regions[it->second];
  if (g.device != device) {
    impl_->misuse.push_back("stream emulator: Free of " +
                            impl_->RegionText(it->second) + " as device " +
                            std::to_string(device));
  }
  g.live = false;
  impl_->stats.alloc_bytes -= static_cast<int64_t>(g.bytes);
  impl_->live.erase(it);
  impl_->pending_free.push_back(p);
}

bool StreamEmulator::PeerReadable(int reader, int owner) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  ++impl_->stats.peer_queries;
  if (reader == owner) return true;
  auto it = impl_->peer.find({reader, owner});
  const bool ok = it == impl_->peer.end() || it->second;
  if (ok) impl_->enabled[{reader, owner}] = true;
  return ok;
}

std::string StreamEmulator::Record(EventId e, StreamId s) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckEvent(e, "Record");
  if (err.empty()) err = impl_->CheckStream(s, "Record");
  if (!err.empty()) return err;
  if (impl_->events[e].device != impl_->streams[s].device) {
    // cudaEventRecord: "event and stream must be on the same device".
    return "stream emulator: Record: event " + std::to_string(e) +
           " of device " + std::to_string(impl_->events[e].device) + " on " +
           impl_->StreamText(s);
  }
  OpRec op;
  op.kind = Kind::kRecord;
  op.stream = s;
  err = impl_->Issue(std::move(op), {}, false);
  if (!err.empty()) return err;
  impl_->events[e].latest = static_cast<int32_t>(impl_->ops.size() - 1);
  return std::string();
}

std::string StreamEmulator::Wait(StreamId s, EventId e) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "Wait");
  if (err.empty()) err = impl_->CheckEvent(e, "Wait");
  if (!err.empty()) return err;
  OpRec op;
  op.kind = Kind::kWait;
  op.stream = s;
  op.bound = impl_->events[e].latest;  // bound now, as in CUDA
  return impl_->Issue(std::move(op), {}, false);
}

std::string StreamEmulator::Copy(StreamId s, void* dst, int dst_device,
                                 const void* src, int src_device,
                                 size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "Copy");
  if (!err.empty()) return err;
  const int sd = impl_->DeviceOf(src, bytes);
  const int dd = impl_->DeviceOf(dst, bytes);
  if ((sd >= 0 && sd != src_device) || (dd >= 0 && dd != dst_device)) {
    return "stream emulator: Copy on " + impl_->StreamText(s) +
           ": memory of devices " + std::to_string(sd) + " -> " +
           std::to_string(dd) + " named as devices " +
           std::to_string(src_device) + " -> " + std::to_string(dst_device);
  }
  OpRec op;
  op.kind = Kind::kCopy;
  op.stream = s;
  op.dst = dst;
  op.a = src;
  op.bytes = bytes;
  // A copy engine moves the bytes; peer access is not needed.
  return impl_->Issue(std::move(op),
                      {{src, bytes, false}, {dst, bytes, true}}, false);
}

std::string StreamEmulator::Reduce(StreamId s, DType d, ReduceOp rop, void* dst,
                                   const StreamOperand* ops, int nops, int64_t n) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "Reduce");
  if (!err.empty()) return err;
  if (!ValidDType(d) || n < 0 || nops < 2 || nops > kMaxFuse + 1 ||
      static_cast<int>(rop) < 0 || static_cast<int>(rop) >= kNumReduceOps) {
    return "stream emulator: Reduce: invalid dtype, reduce op, count or operand count";
  }
  const size_t un = static_cast<size_t>(n);
  OpRec op;
  op.kind = Kind::kReduce;
  op.stream = s;
  op.dtype = d;
  op.reduce_op = rop;
  op.dst = dst;
  op.operands.assign(ops, ops + nops);
  op.n = n;
  std::vector<Want> wants;
  for (int j = 0; j < nops; ++j) {
    wants.push_back({ops[j].p, un * (ops[j].is_input ? DTypeSize(d) : AccSize(d)), false});
  }
  wants.push_back({dst, un * AccSize(d), true});
  return impl_->Issue(std::move(op), wants, true);
}

std::string StreamEmulator::ToAcc(StreamId s, DType d, void* dst,
                                  const void* src, int64_t n) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "ToAcc");
  if (!err.empty()) return err;
  if (!HasScratchAcc(d) || n < 0) {
    return "stream emulator: ToAcc: needs float16 or bfloat16 and n >= 0";
  }
  const size_t un = static_cast<size_t>(n);
  OpRec op;
  op.kind = Kind::kToAcc;
  op.stream = s;
  op.dtype = d;
  op.dst = dst;
  op.a = src;
  op.n = n;
  return impl_->Issue(std::move(op),
                      {{src, un * DTypeSize(d), false},
                       {dst, un * AccSize(d), true}},
                      true);
}

std::string StreamEmulator::Finalize(StreamId s, DType d, void* out,
                                     const void* acc, int64_t n) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "Finalize");
  if (!err.empty()) return err;
  if (!ValidDType(d) || n < 0) {
    return "stream emulator: Finalize: invalid dtype or count";
  }
  const size_t un = static_cast<size_t>(n);
  OpRec op;
  op.kind = Kind::kFinalize;
  op.stream = s;
  op.dtype = d;
  op.dst = out;
  op.a = acc;
  op.n = n;
  if (!HasScratchAcc(d) && out == acc) {  // nothing to do, nothing touched
    return impl_->Issue(std::move(op), {}, false);
  }
  // f16/bf16: a rounding kernel; otherwise a device-to-device copy.
  return impl_->Issue(std::move(op),
                      {{acc, un * AccSize(d), false},
                       {out, un * DTypeSize(d), true}},
                      HasScratchAcc(d));
}

void StreamEmulator::SetPeerAccess(int reader, int owner, bool ok) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->peer[{reader, owner}] = ok;
}

std::string StreamEmulator::Label(const void* p, size_t bytes,
                                  std::string name, int device) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (bytes == 0) return std::string();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = impl_->live.lower_bound(a + bytes);
  if (it != impl_->live.begin()) {
    Region& prev = impl_->regions[std::prev(it)->second];
    if (prev.begin + prev.bytes > a) {
      if (prev.begin == a && prev.bytes == bytes && prev.alloc_index < 0 &&
          prev.device == device) {
        prev.name += "=" + name;  // the same buffer under another name
        return std::string();
      }
      return "stream emulator: Label '" + name + "' overlaps " +
             impl_->RegionText(std::prev(it)->second);
    }
  }
  Region g;
  g.begin = a;
  g.bytes = bytes;
  g.device = device;
  g.name = std::move(name);
  impl_->regions.push_back(std::move(g));
  impl_->live[a] = static_cast<int32_t>(impl_->regions.size() - 1);
  return std::string();
}

void StreamEmulator::NameStream(StreamId s, std::string name) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (s >= 0 && s < static_cast<StreamId>(impl_->streams.size())) {
    impl_->streams[s].name = std::move(name);
  }
}

std::string StreamEmulator::Touch(StreamId s, std::vector<Range> reads,
                                  std::vector<Range> writes, std::string label,
                                  std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::string err = impl_->CheckStream(s, "Touch");
  if (!err.empty()) return err;
  std::vector<Want> wants;
  for (const Range& r : reads) wants.push_back({r.p, r.bytes, false});
  for (const Range& r : writes) wants.push_back({r.p, r.bytes, true});
  OpRec op;
  op.kind = Kind::kTouch;
  op.stream = s;
  op.label = std::move(label);
  op.fn = std::move(fn);
  return impl_->Issue(std::move(op), wants, false);
}

std::string StreamEmulator::Run(uint64_t seed) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  Impl& m = *impl_;
  std::mt19937_64 rng(seed);
  std::string error;
  size_t remaining = 0;
  for (const Stream& st : m.streams) remaining += st.queue.size();
  std::vector<StreamId> runnable;
  while (remaining > 0) {
    runnable.clear();
    for (StreamId s = 0; s < static_cast<StreamId>(m.streams.size()); ++s) {
      const Stream& st = m.streams[s];
      if (!st.queue.empty() && m.Runnable(m.ops[st.queue.front()])) {
        runnable.push_back(s);
      }
    }
    if (runnable.empty()) {
      // Unreachable when every wait binds to a record issued before it (as
      // here); kept so that a bug in the emulator cannot hang a test.
      std::ostringstream os;
      os << "stream emulator: deadlock with " << remaining
         << " ops left; stuck:";
      for (StreamId s = 0; s < static_cast<StreamId>(m.streams.size()); ++s) {
        Stream& st = m.streams[s];
        if (st.queue.empty()) continue;
        const OpRec& head = m.ops[st.queue.front()];
        os << " " << m.StreamText(s) << " at Wait#" << head.seq << " for "
           << m.OpText(head.bound) << ";";
        st.queue.clear();
      }
      error = os.str();
      break;
    }
    Stream& st = m.streams[runnable[rng() % runnable.size()]];
    const int32_t id = st.queue.front();
    st.queue.pop_front();
    m.Execute(m.ops[id]);
    --remaining;
  }
  m.CheckRaces();
  for (void* p : m.pending_free) {
    auto it = std::find(m.owned.begin(), m.owned.end(), p);
    if (it != m.owned.end()) m.owned.erase(it);
    std::free(p);
  }
  m.pending_free.clear();
  for (const std::string& e : m.misuse) {
    error += (error.empty() ? "" : "; ") + e;
  }
  m.misuse.clear();
  return error;
}

std::string StreamEmulator::Reset() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  Impl& m = *impl_;
  for (const Stream& st : m.streams) {
    if (!st.queue.empty()) {
      return "stream emulator: Reset with ops queued (call Run first)";
    }
  }
  m.seq_base += static_cast<int64_t>(m.ops.size());
  m.ops.clear();
  m.accesses.clear();
  m.clocks.clear();
  m.checked = 0;
  m.races.clear();
  m.stats.races = 0;
  // Everything recorded so far has run: later waits need not bind to it.
  for (Event& e : m.events) e.latest = -1;
  return std::string();
}

const std::vector<std::string>& StreamEmulator::races() const {
  return impl_->races;
}

const StreamEmulatorStats& StreamEmulator::stats() const {
  return impl_->stats;
}

}  // namespace jax_blink
