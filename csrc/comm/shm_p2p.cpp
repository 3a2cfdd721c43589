// send / recv over per-pair channels.
//
// Channel src -> dst has one writer and one reader and two halves used in turn (double buffering): the
// sender may fill half (sent % 2) while sent - consumed < 2, the receiver may read half (consumed % 2)
// while consumed != sent. A message is cut into chunks of chan_payload() bytes, each preceded by a
// ChunkHeader that repeats the message's tag, dtype and size, so the receiver can check its
// expectations on the first chunk before consuming anything.
#include <algorithm>
#include <cstring>

#include "comm/shm_comm.h"
#include "core/errors.h"

namespace sl::comm {

namespace {

void check_p2p(const Tensor& t, int peer, int self, int P, const char* op, const char* peer_name) {
  SL_CHECK(t.defined(), ValueError, op, ": tensor is None (undefined); pass a tensor");
  SL_CHECK(t.device().is_cpu(), ValueError, op, ": tensor is on ", t.device().str(),
           ", but the shm backend moves CPU tensors; copy it with .to(cpu)");
  SL_CHECK(t.dtype() != DType::kBool, TypeError, op, ": bool tensors are not supported; cast to int32 first");
  SL_CHECK(t.is_contiguous(), ValueError, op, ": tensor is not contiguous (shape ", shape_str(t.shape()),
           ", strides ", shape_str(t.strides()), "); pass a contiguous copy");
  SL_CHECK(peer >= 0 && peer < P, ValueError, op, ": ", peer_name, " must be in [0, ", P, "), got ", peer);
  SL_CHECK(peer != self, ValueError, op, ": ", peer_name, " is this rank (", self,
           "); a rank cannot send to or receive from itself");
}

}  // namespace

void ShmComm::send(const Tensor& t, int dst, int64_t tag) {
  check_p2p(t, dst, rank_, P_, "send", "dst");
  std::lock_guard<std::mutex> lock(op_mutex_);
  check_usable("send");
  const Activity what{"send", ++sends_to_[size_t(dst)], dst, tag};
  ChannelHeader& ch = seg_.channel(rank_, dst);
  const size_t payload = seg_.layout().chan_payload();
  const char* data = static_cast<const char*>(t.data_ptr());
  const int64_t total = int64_t(t.nbytes());
  int64_t off = 0;
  do {  // at least one chunk: an empty message still carries its header
    const uint32_t sent = ch.sent.load(std::memory_order_relaxed);  // only this rank writes it
    auto has_room = [&ch, sent] { return sent - ch.consumed.load(std::memory_order_acquire) < 2u; };
    if (!has_room()) wait(what, ch.space_bell, ReadyRef(has_room), WaitFor::kPeer, dst);
    char* half = seg_.channel_half(rank_, dst, sent);
    const int64_t bytes = std::min<int64_t>(int64_t(payload), total - off);
    ChunkHeader hdr{};
    hdr.tag = tag;
    hdr.total_bytes = total;
    hdr.offset = off;
    hdr.bytes = bytes;
    hdr.count = t.numel();
    hdr.dtype = int32_t(t.dtype());
    std::memcpy(half, &hdr, sizeof hdr);
    if (bytes > 0) std::memcpy(half + sizeof(ChunkHeader), data + off, size_t(bytes));
    ch.sent.store(sent + 1, std::memory_order_release);  // publishes the chunk
    ring(ch.data_bell);
    off += bytes;
  } while (off < total);
}

void ShmComm::recv(const Tensor& t, int src, int64_t tag) {
  check_p2p(t, src, rank_, P_, "recv", "src");
  std::lock_guard<std::mutex> lock(op_mutex_);
  check_usable("recv");
  const Activity what{"recv", recvs_from_[size_t(src)] + 1, src, tag};
  ChannelHeader& ch = seg_.channel(src, rank_);
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t total = int64_t(t.nbytes());
  int64_t off = 0;
  bool first = true;
  do {
    const uint32_t consumed = ch.consumed.load(std::memory_order_relaxed);  // only this rank writes it
    auto has_data = [&ch, consumed] { return ch.sent.load(std::memory_order_acquire) != consumed; };
    if (!has_data()) wait(what, ch.data_bell, ReadyRef(has_data), WaitFor::kPeer, src);
    const char* half = seg_.channel_half(src, rank_, consumed);
    ChunkHeader hdr;
    std::memcpy(&hdr, half, sizeof hdr);
    if (first) {
      // Not consumed: the message stays first in the channel for a recv that matches it.
      SL_CHECK(hdr.tag == tag && hdr.dtype == int32_t(t.dtype()) && hdr.total_bytes == total, ValueError,
               "recv: rank ", src, " sent a message with tag ", hdr.tag, " (", hdr.count, " ",
               dtype_name(DType(hdr.dtype)), " elements), but this recv from rank ", src, " expects tag ", tag, " (",
               t.numel(), " ", dtype_name(t.dtype()), " elements); the message stays queued: match the tags, "
               "dtypes and sizes of send and recv");
      SL_ASSERT(hdr.offset == 0);
      first = false;
      ++recvs_from_[size_t(src)];
    }
    SL_ASSERT(hdr.offset == off && hdr.bytes >= 0 && hdr.bytes <= total - off &&
              size_t(hdr.bytes) <= seg_.layout().chan_payload());
    if (hdr.bytes > 0) std::memcpy(data + off, half + sizeof(ChunkHeader), size_t(hdr.bytes));
    ch.consumed.store(consumed + 1, std::memory_order_release);  // hands the half back to the sender
    ring(ch.space_bell);
    off += hdr.bytes;
  } while (off < total);
}

}  // namespace sl::comm
