// SegmentLogImpl::Init: opening a directory of segment files (the scan,
// salvage of what is readable, quarantine of what is not).
#include "storage/tier2/segment_log_impl.h"

#include <fstream>

namespace evoke {
namespace segment_internal {

absl::Status SegmentLogImpl::Init(std::vector<std::string>* notes) {
  if (opts_.dir.empty()) return absl::InvalidArgumentError("segment log: no directory");
  if (opts_.segment_bytes < kMinSegmentBytes || opts_.segment_bytes % kSegmentGranule != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment log: segment_bytes ", opts_.segment_bytes,
                     " is not a multiple of 1 MiB of at least 4 MiB"));
  }
  quarantine_dir_ = opts_.quarantine_dir;
  if (quarantine_dir_.empty()) {
    std::string parent = std::filesystem::path(opts_.dir).parent_path().string();
    if (parent.empty()) parent = ".";
    quarantine_dir_ =
        absl::StrCat(parent, "/quarantine-", absl::ToUnixSeconds(absl::Now()));
  }
  EVOKE_RETURN_IF_ERROR(io_->CreateDir(opts_.dir));
  max_size_ = opts_.segment_bytes;
  if (struct statvfs st {}; statvfs(opts_.dir.c_str(), &st) == 0) {
    const uint64_t total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
    if (total > 0) {
      max_size_ = std::clamp<uint64_t>(total / 16 / kSegmentGranule * kSegmentGranule,
                                       kMinSegmentBytes, opts_.segment_bytes);
    }
  }
  {
    absl::MutexLock w(&write_mu_);
    next_size_[0] = next_size_[1] = std::min(kFirstSegmentBytes, max_size_);
  }

  // Probe what the filesystem allows: O_DIRECT or not, and the alignment.
  {
    const std::string probe = opts_.dir + "/.dio-probe";
    EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SegmentFile> f,
                           io_->Open(probe, {.create = true, .truncate = true,
                                             .direct = opts_.direct_io}));
    direct_ = f->direct();
    align_ = std::max(kMinSegmentAlign, f->alignment());
    f.reset();
    (void)io_->Remove(probe);
  }

  EVOKE_ASSIGN_OR_RETURN(std::vector<std::string> names, io_->List(opts_.dir));
  uint64_t max_id = 0;
  for (const std::string& name : names) {
    uint64_t id = 0;
    if (ParseSegmentName(name, &id)) {
      max_id = std::max(max_id, id);
      LoadSegment(id, name, notes);
    } else if (absl::EndsWith(name, ".evs.tmp")) {
      // A segment whose creation did not finish: nothing was ever appended
      // to it (its header is synced and renamed before the first append).
      (void)io_->Remove(opts_.dir + "/" + name);
      notes->push_back(absl::StrCat("segments: removed ", name, " (creation interrupted)"));
    }
    // Other names are not ours: left alone.
  }
  absl::MutexLock w(&write_mu_);
  next_id_ = max_id + 1;
  return absl::OkStatus();
}

void SegmentLogImpl::Quarantine(const std::string& name, const std::string& why,
                                std::vector<std::string>* notes) {
  quarantined_.fetch_add(1, std::memory_order_relaxed);
  const std::string from = opts_.dir + "/" + name;
  absl::Status s = io_->CreateDir(quarantine_dir_);
  if (s.ok()) s = io_->Rename(from, quarantine_dir_ + "/" + name);
  if (s.ok()) s = io_->SyncDir(opts_.dir);
  if (s.ok()) {
    notes->push_back(absl::StrCat("segments: ", name, " moved to ", quarantine_dir_, " (", why,
                                  "); the payloads in it are not served"));
  } else {
    notes->push_back(absl::StrCat("segments: ", name, " is unreadable (", why,
                                  ") and could not be moved aside (", s.ToString(),
                                  "); it is ignored"));
  }
  EVOKE_LOG_WARNING("segment log: ", notes->back());
}

void SegmentLogImpl::LoadSegment(uint64_t id, const std::string& name,
                                 std::vector<std::string>* notes) {
  const std::string path = opts_.dir + "/" + name;
  absl::StatusOr<std::unique_ptr<SegmentFile>> file =
      io_->Open(path, {.create = false, .truncate = false, .direct = opts_.direct_io});
  if (!file.ok()) {
    notes->push_back(absl::StrCat("segments: cannot open ", name, " (", file.status().ToString(),
                                  "); its payloads are not served"));
    return;
  }
  absl::StatusOr<AlignedBuffer> buf = AlignedBuffer::Allocate(RoundUp(kFileHeaderBytes, align_),
                                                              align_);
  if (!buf.ok()) {
    notes->push_back(absl::StrCat("segments: ", name, ": ", buf.status().ToString()));
    return;
  }
  absl::StatusOr<size_t> n = (*file)->Read(0, buf->data(), buf->size());
  std::string why;
  FileHeader h;
  if (!n.ok()) {
    // An I/O error, not proof of corruption: leave the file where it is.
    notes->push_back(absl::StrCat("segments: reading the header of ", name, " failed (",
                                  n.status().ToString(), "); its payloads are not served"));
    return;
  }
  if (*n < kFileHeaderUsed) {
    why = absl::StrCat("file of ", *n, " bytes is shorter than a header");
  } else {
    why = DecodeFileHeader(buf->data(), &h);
    if (why.empty() && h.id != id) why = absl::StrCat("header names segment ", h.id);
    if (why.empty() && h.instance != opts_.instance) {
      why = "it belongs to another data directory (instance id differs)";
    }
    // A file cut inside its header block holds no record, and its header's
    // promises (size, footer) no longer hold.
    if (why.empty()) {
      const uint64_t data_start = RoundUp(kFileHeaderBytes, h.align);
      absl::StatusOr<uint64_t> size = (*file)->Size();
      if (size.ok() && *size < data_start) {
        why = absl::StrCat("file of ", *size, " bytes ends inside its ", data_start,
                           "-byte header");
      }
    }
  }
  if (!why.empty()) {
    file->reset();
    Quarantine(name, why, notes);
    return;
  }
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = path;
  seg->file = std::move(*file);
  seg->data_start = RoundUp(kFileHeaderBytes, h.align);
  seg->created_ms = h.created_ms;
  // Whether it holds tombstones is not known without reading it.
  seg->may_hold_tombstones.store(true);
  absl::StatusOr<uint64_t> size = seg->file->Size();
  seg->size = size.ok() ? *size : h.size;
  absl::StatusOr<std::optional<ScanResult>> footer = ReadFooter(*seg->file, h, seg->data_start);
  absl::StatusOr<ScanResult> scan = absl::InternalError("unset");
  if (!footer.ok()) {
    scan = footer.status();
  } else if (footer->has_value()) {
    scan = **footer;
  } else {
    scan = Scan(*seg->file, seg->data_start);
  }
  if (!scan.ok()) {
    notes->push_back(absl::StrCat("segments: scanning ", name, " failed (",
                                  scan.status().ToString(), "); its payloads are not served"));
    return;
  }
  seg->valid_end.store(scan->valid_end);
  seg->max_seq.store(scan->max_seq);
  seg->last_payload_seq.store(scan->last_payload_seq);
  seg->write_end = RoundUp(scan->valid_end, align_);
  if (scan->torn_bytes > 0) {
    torn_tail_bytes_.fetch_add(scan->torn_bytes, std::memory_order_relaxed);
    notes->push_back(absl::StrCat("segments: ", name, ": dropped a torn tail of ",
                                  scan->torn_bytes, " bytes at offset ", scan->valid_end,
                                  " (never acknowledged)"));
  }
  {
    absl::MutexLock w(&write_mu_);
    next_seq_ = std::max(next_seq_, scan->max_seq + 1);
    absl::MutexLock lock(&mu_);
    segments_[id] = std::move(seg);
  }
}

absl::StatusOr<std::optional<SegmentLogImpl::ScanResult>> SegmentLogImpl::ReadFooter(
    SegmentFile& file, const FileHeader& h, uint64_t data_start) {
  EVOKE_ASSIGN_OR_RETURN(const uint64_t file_size, file.Size());
  const uint64_t block = std::max<uint64_t>(align_, h.align);
  if (h.size < data_start + 2 * block || file_size < h.size || h.size % block != 0) {
    return std::nullopt;
  }
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(block, align_));
  const uint64_t footer_at = h.size - h.align;
  const uint64_t footer_block = RoundDown(footer_at, align_);
  EVOKE_ASSIGN_OR_RETURN(size_t n, file.Read(footer_block, buf.data(), block));
  read_bytes_.fetch_add(n, std::memory_order_relaxed);
  if (n < footer_at - footer_block + kRecordHeaderBytes) return std::nullopt;
  char footer[kRecordHeaderBytes];
  memcpy(footer, buf.data() + (footer_at - footer_block), kRecordHeaderBytes);
  RecordHeader f;
  if (!DecodeRecord(footer, &f) || f.type != kSeal || f.flags != 0 || f.length != 0) {
    return std::nullopt;
  }
  const uint64_t seal_at = f.checksum;
  if (seal_at % kRecordAlign != 0 || seal_at < data_start || seal_at > footer_at) {
    return std::nullopt;
  }
  if (seal_at != footer_at) {
    const uint64_t seal_block = RoundDown(seal_at, align_);
    EVOKE_ASSIGN_OR_RETURN(n, file.Read(seal_block, buf.data(), block));
    read_bytes_.fetch_add(n, std::memory_order_relaxed);
    if (n < seal_at - seal_block + kRecordHeaderBytes ||
        memcmp(buf.data() + (seal_at - seal_block), footer, kRecordHeaderBytes) != 0) {
      return std::nullopt;
    }
  }
  ScanResult r;
  r.valid_end = seal_at + kRecordHeaderBytes;
  r.max_seq = f.seq;  // The seal's seq is the segment's last.
  // Its batch_seq names the last payload record; a seal from before that
  // holds its own seq: then it is not known (0), and an upgraded store does
  // not salvage its old segments at its first start (their records have no
  // identity, and deleted blocks' garbage in them would read as losses).
  r.last_payload_seq = f.batch_seq < f.seq ? f.batch_seq : 0;
  r.sealed = true;
  return r;
}

absl::StatusOr<SegmentLogImpl::ScanResult> SegmentLogImpl::Scan(SegmentFile& file,
                                                                uint64_t data_start) {
  ScanResult r;
  r.valid_end = data_start;
  EVOKE_ASSIGN_OR_RETURN(const uint64_t file_size, file.Size());
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer window,
                         AlignedBuffer::Allocate(std::min<uint64_t>(kMaxIoBytes, 1 << 20), align_));
  uint64_t wbegin = 0, wend = 0;  // The bytes of the file in `window`.
  // Loads the aligned window holding [off, off + 64); false at the end.
  auto load = [&](uint64_t off) -> absl::StatusOr<bool> {
    if (off >= wbegin && off + kRecordHeaderBytes <= wend) return true;
    wbegin = RoundDown(off, align_);
    EVOKE_ASSIGN_OR_RETURN(size_t n, file.Read(wbegin, window.data(), window.size()));
    read_bytes_.fetch_add(n, std::memory_order_relaxed);
    wend = wbegin + n;
    return off + kRecordHeaderBytes <= wend;
  };
  uint64_t off = data_start;
  uint64_t prev_seq = 0;
  while (off + kRecordHeaderBytes <= file_size) {
    EVOKE_ASSIGN_OR_RETURN(bool have, load(off));
    if (!have) break;
    RecordHeader h;
    if (!DecodeRecord(window.data() + (off - wbegin), &h)) break;
    if (h.flags != 0 || h.seq <= prev_seq) break;
    if (h.type == kSeal) {
      if (h.length != 0) break;
    } else if (h.type == kPayload || h.type == kSkip || h.type == kIdentity) {
      if (h.type != kSkip && h.length == 0) break;
    } else if (h.type == kTombstone) {
      if (h.length != kTombstoneBytes) break;
    } else {
      break;
    }
    const uint64_t room = file_size - off - kRecordHeaderBytes;
    if (h.length > room || RoundUp(h.length, kRecordAlign) > room) break;
    prev_seq = h.seq;
    r.max_seq = std::max(r.max_seq, h.seq);
    if (h.type == kPayload) r.last_payload_seq = h.seq;
    off += kRecordHeaderBytes + RoundUp(h.length, kRecordAlign);
    r.valid_end = off;
    if (h.type == kSeal) {
      r.sealed = true;
      break;
    }
  }
  if (r.sealed) return r;
  // Bytes past the valid end that are not zero were a batch that did not
  // finish (a torn tail). Count them up to the first all-zero block.
  uint64_t pos = r.valid_end;
  while (pos < file_size) {
    const uint64_t block_begin = RoundDown(pos, align_);
    if (!(pos >= wbegin && pos < wend)) {
      wbegin = block_begin;
      EVOKE_ASSIGN_OR_RETURN(size_t n, file.Read(wbegin, window.data(), window.size()));
      read_bytes_.fetch_add(n, std::memory_order_relaxed);
      wend = wbegin + n;
      if (n == 0) break;
    }
    const uint64_t block_end = std::min(wend, block_begin + align_);
    const char* p = window.data() + (pos - wbegin);
    const uint64_t len = block_end - pos;
    bool zero = true;
    for (uint64_t i = 0; i < len && zero; ++i) zero = p[i] == 0;
    if (zero) break;
    r.torn_bytes += len;
    pos = block_end;
  }
  return r;
}

}  // namespace segment_internal

std::optional<std::array<uint8_t, 16>> ReadSegmentInstance(const std::string& dir) {
  using namespace segment_internal;  // NOLINT: the encodings.
  std::map<std::array<uint8_t, 16>, int> votes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    uint64_t id = 0;
    if (!ParseSegmentName(entry.path().filename().string(), &id)) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    char header[kFileHeaderUsed];
    if (!in.read(header, sizeof(header))) continue;
    FileHeader h;
    if (DecodeFileHeader(header, &h).empty() && h.id == id) ++votes[h.instance];
  }
  std::optional<std::array<uint8_t, 16>> best;
  int most = 0;
  for (const auto& [instance, n] : votes) {
    if (n > most) {
      best = instance;
      most = n;
    }
  }
  return best;
}

}  // namespace evoke
