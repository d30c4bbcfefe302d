// SegmentLogImpl: appends, seals, reads and removal of segment files, and
// SegmentLog::Open. Opening a directory is in segment_log_open.cc; the class
// and the on-disk encodings are in segment_log_impl.h.
#include "storage/tier2/segment_log_impl.h"

namespace evoke {
namespace segment_internal {

// A per-thread read buffer, so that reads of similar sizes do not allocate.
thread_local AlignedBuffer tls_read_buffer;

// ------------------------------------------------------------ Append

absl::Status SegmentLogImpl::EnsureStaging() {
  if (!staging_.empty()) return absl::OkStatus();
  EVOKE_ASSIGN_OR_RETURN(staging_, AlignedBuffer::Allocate(kMaxIoBytes, align_));
  return absl::OkStatus();
}

void SegmentLogImpl::Poison(Segment& seg, SegmentStream stream) {
  absl::MutexLock lock(&mu_);
  seg.poisoned = true;
  seg.active = false;
  std::shared_ptr<Segment>& a = active_[static_cast<int>(stream)];
  if (a.get() == &seg) a.reset();
}

absl::StatusOr<std::shared_ptr<Segment>> SegmentLogImpl::CreateSegment(SegmentStream stream,
                                                                       uint64_t record_bytes) {
  const uint64_t id = next_id_++;
  const uint64_t data_start = RoundUp(kFileHeaderBytes, align_);
  uint64_t& next = next_size_[static_cast<int>(stream)];
  // Room for the record, its batch padding and the seal record.
  const uint64_t size = std::max<uint64_t>(
      next, RoundUp(data_start + RoundUp(record_bytes, align_) + align_, kSegmentGranule));
  next = std::min(next * 2, max_size_);
  const std::string path = Path(id);
  const std::string tmp = path + ".tmp";
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SegmentFile> file,
                         io_->Open(tmp, {.create = true, .truncate = true,
                                         .direct = opts_.direct_io}));
  auto fail = [&](absl::Status s) {
    file.reset();
    (void)io_->Remove(tmp);
    return s;
  };
  // fallocate first: no space shows up here, before anything is written,
  // and appends never change the file's size (fdatasync then has no size
  // to commit).
  if (absl::Status s = file->Allocate(size); !s.ok()) return fail(s);
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer header, AlignedBuffer::Allocate(data_start, align_));
  memset(header.data(), 0, data_start);
  FileHeader h;
  h.align = align_;
  h.id = id;
  h.instance = opts_.instance;
  h.created_ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  h.size = size;
  EncodeFileHeader(h, header.data());
  if (absl::Status s = file->Write(0, header.data(), data_start); !s.ok()) return fail(s);
  bytes_written_.fetch_add(data_start, std::memory_order_relaxed);
  syncs_.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = file->Sync(); !s.ok()) return fail(s);
  // The name appears only once the header is durable: a seg-*.evs file
  // always has one.
  if (absl::Status s = io_->Rename(tmp, path); !s.ok()) return fail(s);
  file.reset();
  // Reopened under its final name, so that errors name the right file.
  absl::Status s = io_->SyncDir(opts_.dir);
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<SegmentFile>> f =
        io_->Open(path, {.create = false, .truncate = false, .direct = opts_.direct_io});
    if (f.ok()) {
      file = std::move(*f);
    } else {
      s = f.status();
    }
  }
  if (!s.ok()) {
    // The file may or may not survive a crash; either way it holds no
    // record. Use it no further.
    (void)io_->Remove(path);
    return s;
  }
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = path;
  seg->file = std::move(file);
  seg->size = size;
  seg->data_start = data_start;
  seg->created_ms = h.created_ms;
  seg->stream = stream;
  seg->valid_end.store(data_start);
  seg->write_end = data_start;
  seg->active = true;
  {
    absl::MutexLock lock(&mu_);
    segments_[id] = seg;
  }
  active_[static_cast<int>(stream)] = seg;
  return seg;
}

uint64_t SegmentLogImpl::Item::Bytes() const {
  if (tombstone != nullptr) return SegmentRecordBytes(kTombstoneBytes);
  return SegmentRecordBytes(record->payload.size()) +
         (record->identity.empty() ? 0 : SegmentRecordBytes(record->identity.size()));
}

absl::Status SegmentLogImpl::WriteBatch(Segment& seg, absl::Span<const Item> items,
                                        std::vector<PayloadLocation>* out, bool sync) {
  EVOKE_RETURN_IF_ERROR(EnsureStaging());
  const uint64_t batch_seq = next_seq_;
  uint64_t seq = next_seq_;
  uint64_t off = seg.write_end;
  Stager st(seg.file.get(), &staging_, &spare_staging_, align_, opts_.writes_in_flight,
            seg.write_end);
  std::vector<PayloadLocation> placed;
  placed.reserve(items.size());
  char header[kRecordHeaderBytes];
  uint64_t payload = 0, identity = 0, tombstones = 0, last_payload = 0;
  absl::Status s;
  // One record: header, bytes, zeros up to the record alignment.
  auto put = [&](uint16_t type, const BlockId& id, absl::string_view bytes,
                 uint64_t checksum) -> absl::Status {
    RecordHeader h;
    h.type = type;
    h.id = id;
    h.seq = seq++;
    h.length = bytes.size();
    h.checksum = checksum;
    h.batch_seq = batch_seq;
    EncodeRecord(h, header);
    EVOKE_RETURN_IF_ERROR(st.Put(header, kRecordHeaderBytes));
    EVOKE_RETURN_IF_ERROR(st.Put(bytes.data(), bytes.size()));
    EVOKE_RETURN_IF_ERROR(st.Zero(RoundUp(bytes.size(), kRecordAlign) - bytes.size()));
    off += SegmentRecordBytes(bytes.size());
    return absl::OkStatus();
  };
  for (const Item& item : items) {
    if (item.tombstone != nullptr) {
      char body[kTombstoneBytes];
      Put64(body, item.tombstone->kills.segment);
      Put64(body + 8, item.tombstone->kills.seq);
      Put64(body + 16, item.tombstone->kind);
      const absl::string_view bytes(body, sizeof(body));
      s = put(kTombstone, item.tombstone->id, bytes, XXH3_64bits(body, sizeof(body)));
      if (!s.ok()) break;
      ++tombstones;
      continue;
    }
    const SegmentAppend& r = *item.record;
    if (!r.identity.empty()) {
      s = put(kIdentity, r.id, r.identity, XXH3_64bits(r.identity.data(), r.identity.size()));
      if (!s.ok()) break;
      identity += SegmentRecordBytes(r.identity.size());
    }
    const PayloadLocation at{seg.id, off, r.payload.size(), seq};
    last_payload = seq;
    s = put(kPayload, r.id, r.payload, r.checksum);
    if (!s.ok()) break;
    placed.push_back(at);
    payload += r.payload.size();
  }
  if (s.ok()) {
    // Pad to the alignment with a skip record, so that the next batch
    // starts on a fresh page and a synced page is never written again.
    const uint64_t gap = RoundUp(off, align_) - off;
    if (gap > 0) {
      RecordHeader h;
      h.type = kSkip;
      h.seq = seq++;
      h.length = gap - kRecordHeaderBytes;
      h.batch_seq = batch_seq;
      EncodeRecord(h, header);
      s = st.Put(header, kRecordHeaderBytes);
      if (s.ok()) s = st.Zero(gap - kRecordHeaderBytes);
      off += gap;
    }
  }
  if (s.ok()) s = st.Flush();
  bytes_written_.fetch_add(st.written(), std::memory_order_relaxed);
  // Sequence numbers stay unique even for a batch that failed (parts of it
  // may be on disk).
  next_seq_ = seq;
  if (tombstones > 0) seg.may_hold_tombstones.store(true, std::memory_order_relaxed);
  if (s.ok() && sync) s = SyncFile(seg);
  if (!s.ok()) return s;
  batches_.fetch_add(1, std::memory_order_relaxed);
  payload_bytes_.fetch_add(payload, std::memory_order_relaxed);
  identity_bytes_.fetch_add(identity, std::memory_order_relaxed);
  tombstones_.fetch_add(tombstones, std::memory_order_relaxed);
  seg.write_end = off;
  seg.max_seq.store(seq - 1, std::memory_order_relaxed);
  if (last_payload != 0) seg.last_payload_seq.store(last_payload, std::memory_order_relaxed);
  seg.valid_end.store(off, std::memory_order_release);
  out->insert(out->end(), placed.begin(), placed.end());
  return absl::OkStatus();
}

absl::Status SegmentLogImpl::WriteSeal(Segment& seg) {
  EVOKE_RETURN_IF_ERROR(EnsureStaging());
  memset(staging_.data(), 0, align_);
  RecordHeader h;
  h.type = kSeal;
  h.seq = next_seq_++;
  // The seal's batch_seq names the segment's last payload record (0: none),
  // so that Open knows it without a scan. Seals written before this held
  // their own seq there.
  h.batch_seq = seg.last_payload_seq.load(std::memory_order_relaxed);
  // A seal has no payload; its checksum field holds its own offset, so that
  // the copy in the segment's last block (the footer) says where it is.
  h.checksum = seg.write_end;
  EncodeRecord(h, staging_.data());
  EVOKE_RETURN_IF_ERROR(seg.file->Write(seg.write_end, staging_.data(), align_));
  bytes_written_.fetch_add(align_, std::memory_order_relaxed);
  const uint64_t footer = seg.size - align_;
  if (footer != seg.write_end) {
    // The footer: Open finds a sealed segment's end by reading two blocks
    // instead of scanning every record header.
    EVOKE_RETURN_IF_ERROR(seg.file->Write(footer, staging_.data(), align_));
    bytes_written_.fetch_add(align_, std::memory_order_relaxed);
  }
  EVOKE_RETURN_IF_ERROR(SyncFile(seg));
  seg.max_seq.store(h.seq, std::memory_order_relaxed);
  seg.valid_end.store(seg.write_end + kRecordHeaderBytes, std::memory_order_release);
  seg.write_end += align_;
  return absl::OkStatus();
}

// Append fails RESOURCE_EXHAUSTED (no space) or UNAVAILABLE (anything
// else the device said), as the interface promises.
absl::Status AppendError(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kResourceExhausted) return s;
  return absl::UnavailableError(s.message());
}

absl::StatusOr<std::vector<PayloadLocation>> SegmentLogImpl::Append(
    absl::Span<const SegmentAppend> records, SegmentStream stream,
    absl::Span<const SegmentTombstone> tombstones, bool sync) {
  absl::MutexLock w(&write_mu_);
  std::vector<PayloadLocation> out;
  out.reserve(records.size());
  std::vector<Item> items;
  items.reserve(tombstones.size() + records.size());
  for (const SegmentTombstone& t : tombstones) items.push_back({nullptr, &t});
  for (const SegmentAppend& r : records) {
    if (r.payload.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment log: empty payload for block ", r.id.ToHex()));
    }
    items.push_back({&r, nullptr});
  }
  const int k = static_cast<int>(stream);
  size_t i = 0;
  while (i < items.size()) {
    std::shared_ptr<Segment> seg = active_[k];
    if (seg == nullptr) {
      absl::StatusOr<std::shared_ptr<Segment>> created = CreateSegment(stream, items[i].Bytes());
      if (!created.ok()) return AppendError(created.status());
      seg = std::move(*created);
    }
    // As many items as fit, leaving one aligned block for the seal.
    const uint64_t limit = seg->size - align_;
    uint64_t bytes = 0;
    size_t j = i;
    while (j < items.size()) {
      const uint64_t b = items[j].Bytes();
      if (seg->write_end + RoundUp(bytes + b, align_) > limit) break;
      bytes += b;
      ++j;
    }
    if (j == i) {
      if (seg->write_end == seg->data_start) {
        return absl::InternalError("segment log: a new segment has no room for the record");
      }
      // Roll: seal the full segment (a clean end for the restart scan) and
      // start a new one. A failed seal only poisons the old segment.
      if (absl::Status s = WriteSeal(*seg); !s.ok()) {
        EVOKE_LOG_WARNING("segment log: sealing ", seg->path, " failed: ", s.ToString());
        Poison(*seg, stream);
      } else {
        absl::MutexLock lock(&mu_);
        seg->active = false;
      }
      active_[k].reset();
      continue;
    }
    if (absl::Status s =
            WriteBatch(*seg, absl::MakeConstSpan(items).subspan(i, j - i), &out, sync);
        !s.ok()) {
      Poison(*seg, stream);
      EVOKE_LOG_WARNING("segment log: append to ", seg->path,
                        " failed; the segment takes no more appends: ", s.ToString());
      return AppendError(s);
    }
    i = j;
  }
  return out;
}

absl::Status SegmentLogImpl::Seal(SegmentStream stream) {
  absl::MutexLock w(&write_mu_);
  const int k = static_cast<int>(stream);
  std::shared_ptr<Segment> seg = std::move(active_[k]);
  active_[k].reset();
  if (seg == nullptr) return absl::OkStatus();
  absl::Status s = WriteSeal(*seg);
  absl::MutexLock lock(&mu_);
  seg->active = false;
  if (!s.ok()) seg->poisoned = true;
  return s;
}

absl::Status SegmentLogImpl::SyncActive(SegmentStream stream) {
  absl::MutexLock w(&write_mu_);
  std::shared_ptr<Segment> seg = active_[static_cast<int>(stream)];
  if (seg == nullptr) return absl::OkStatus();
  const absl::Status s = SyncFile(*seg);
  if (!s.ok()) Poison(*seg, stream);
  return s;
}

void SegmentLogImpl::AdvanceSeq(uint64_t next) {
  absl::MutexLock w(&write_mu_);
  next_seq_ = std::max(next_seq_, next);
}

// ------------------------------------------------------------ Read

absl::Status SegmentLogImpl::ReadRange(Segment& seg, uint64_t begin, uint64_t size,
                                       uint64_t need_end, char* buf) {
  for (uint64_t done = 0; done < size;) {
    const uint64_t piece = std::min<uint64_t>(kMaxIoBytes, size - done);
    EVOKE_ASSIGN_OR_RETURN(size_t n, seg.file->Read(begin + done, buf + done, piece));
    read_bytes_.fetch_add(n, std::memory_order_relaxed);
    if (n < piece) {
      if (begin + done + n >= need_end) return absl::OkStatus();
      return absl::DataLossError(absl::StrCat("segment ", seg.id, " (", seg.path,
                                              ") ends at ", begin + done + n,
                                              ", inside its valid range"));
    }
    done += piece;
  }
  return absl::OkStatus();
}

absl::Status SegmentLogImpl::Read(const BlockId& id, const PayloadLocation& l,
                                  const std::function<absl::Status(absl::string_view)>& consume) {
  std::shared_ptr<Segment> seg = Find(l.segment);
  if (seg == nullptr) {
    return absl::NotFoundError(absl::StrCat("segment ", l.segment, " is gone (block ",
                                            id.ToHex(), ")"));
  }
  if (!InRange(*seg, l)) {
    if (l.offset % kRecordAlign != 0 || l.length == 0) {
      header_mismatches_.fetch_add(1, std::memory_order_relaxed);
      return absl::DataLossError(absl::StrCat("segment ", l.segment, " offset ", l.offset,
                                              " length ", l.length,
                                              " is not a record location (block ", id.ToHex(),
                                              ")"));
    }
    return absl::NotFoundError(absl::StrCat("segment ", l.segment, " offset ", l.offset,
                                            " length ", l.length, " lies past its valid end ",
                                            seg->valid_end.load(), " (block ", id.ToHex(), ")"));
  }
  const uint64_t begin = RoundDown(l.offset, align_);
  const uint64_t end = RoundUp(l.offset + kRecordHeaderBytes + l.length, align_);
  const uint64_t size = end - begin;
  AlignedBuffer buf = std::move(tls_read_buffer);
  if (buf.size() < size) {
    EVOKE_ASSIGN_OR_RETURN(buf, AlignedBuffer::Allocate(RoundUp(size, kSegmentGranule), align_));
  }
  absl::Status s =
      ReadRange(*seg, begin, size, l.offset + kRecordHeaderBytes + l.length, buf.data());
  if (s.ok()) {
    const char* rec = buf.data() + (l.offset - begin);
    RecordHeader h;
    std::string why;
    if (!DecodeRecord(rec, &h)) {
      why = "its header does not verify";
    } else if (h.type != kPayload) {
      why = absl::StrCat("it is a record of type ", h.type);
    } else if (h.id != id) {
      why = absl::StrCat("it holds block ", h.id.ToHex());
    } else if (h.seq != l.seq) {
      why = absl::StrCat("its seq is ", h.seq, ", not ", l.seq);
    } else if (h.length != l.length) {
      why = absl::StrCat("its length is ", h.length, ", not ", l.length);
    }
    if (!why.empty()) {
      header_mismatches_.fetch_add(1, std::memory_order_relaxed);
      s = absl::DataLossError(absl::StrCat("record at segment ", l.segment, " offset ", l.offset,
                                           " is not block ", id.ToHex(), ": ", why));
    } else {
      s = consume(absl::string_view(rec + kRecordHeaderBytes, l.length));
    }
  }
  if (buf.size() <= kKeepReadBuffer && buf.size() > tls_read_buffer.size()) {
    tls_read_buffer = std::move(buf);
  }
  return s;
}

bool SegmentLogImpl::Contains(const PayloadLocation& l) const {
  std::shared_ptr<Segment> seg = Find(l.segment);
  return seg != nullptr && InRange(*seg, l);
}

absl::Status SegmentLogImpl::ForEachRecord(
    uint64_t segment,
    const std::function<absl::Status(const SegmentRecord& record, bool checksum_ok)>& visit,
    bool payloads) {
  std::shared_ptr<Segment> seg = Find(segment);
  if (seg == nullptr) return absl::NotFoundError(absl::StrCat("segment ", segment, " is gone"));
  const uint64_t valid_end = seg->valid_end.load(std::memory_order_acquire);
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer window, AlignedBuffer::Allocate(kMaxIoBytes, align_));
  AlignedBuffer big;  // For records larger than the window.
  uint64_t wbegin = 0, wend = 0;
  const uint64_t file_end = RoundUp(valid_end, align_);
  // Loads the window from `from` (aligned down) on.
  auto load = [&](uint64_t from) -> absl::Status {
    wbegin = RoundDown(from, align_);
    wend = std::min<uint64_t>(wbegin + window.size(), file_end);
    return ReadRange(*seg, wbegin, wend - wbegin, std::min(wend, valid_end), window.data());
  };
  // The bytes of the record at `off` (header at off): from the window, or
  // read into `big` when they reach past it.
  auto body = [&](uint64_t off, uint64_t length) -> absl::StatusOr<const char*> {
    const uint64_t pbegin = off + kRecordHeaderBytes;
    if (pbegin + length <= wend) return window.data() + (pbegin - wbegin);
    const uint64_t b = RoundDown(pbegin, align_);
    const uint64_t e = RoundUp(pbegin + length, align_);
    if (big.size() < e - b) {
      EVOKE_ASSIGN_OR_RETURN(big, AlignedBuffer::Allocate(RoundUp(e - b, kSegmentGranule),
                                                          align_));
    }
    EVOKE_RETURN_IF_ERROR(ReadRange(*seg, b, e - b, pbegin + length, big.data()));
    return big.data() + (pbegin - b);
  };
  // The identity record just before the current payload record, if any.
  std::string identity;
  BlockId identity_of;
  bool have_identity = false;
  uint64_t off = seg->data_start;
  while (off + kRecordHeaderBytes <= valid_end) {
    if (!(off >= wbegin && off + kRecordHeaderBytes <= wend)) EVOKE_RETURN_IF_ERROR(load(off));
    RecordHeader h;
    if (!DecodeRecord(window.data() + (off - wbegin), &h) ||
        h.length > valid_end - off - kRecordHeaderBytes) {
      header_mismatches_.fetch_add(1, std::memory_order_relaxed);
      return absl::DataLossError(absl::StrCat("segment ", segment, " offset ", off,
                                              ": a record header inside the valid range does "
                                              "not verify"));
    }
    if (h.type == kSeal) break;
    if (h.type == kTombstone && h.length == kTombstoneBytes) {
      EVOKE_ASSIGN_OR_RETURN(const char* p, body(off, h.length));
      // A tombstone whose bytes do not verify is not one.
      if (XXH3_64bits(p, kTombstoneBytes) == h.checksum) {
        SegmentRecord record;
        record.id = h.id;
        record.location = PayloadLocation{segment, off, h.length, h.seq};
        record.tombstone = true;
        record.kills.segment = Get64(p);
        record.kills.seq = Get64(p + 8);
        record.kind = Get64(p + 16) == SegmentTombstone::kDropped ? SegmentTombstone::kDropped
                                                                  : SegmentTombstone::kDeleted;
        EVOKE_RETURN_IF_ERROR(visit(record, true));
      }
    } else if (h.type == kIdentity && payloads) {
      EVOKE_ASSIGN_OR_RETURN(const char* p, body(off, h.length));
      have_identity = XXH3_64bits(p, h.length) == h.checksum;
      if (have_identity) {
        identity.assign(p, h.length);
        identity_of = h.id;
      }
    } else if (h.type == kPayload && payloads) {
      EVOKE_ASSIGN_OR_RETURN(const char* p, body(off, h.length));
      SegmentRecord record;
      record.id = h.id;
      record.location = PayloadLocation{segment, off, h.length, h.seq};
      record.checksum = h.checksum;
      record.payload = absl::string_view(p, h.length);
      if (have_identity && identity_of == h.id) record.identity = identity;
      // Off the hot path (compaction, verify, salvage): the payload is
      // checked here so that a corrupt copy is never moved as if it were
      // good.
      const bool ok = PayloadChecksum(p, h.length) == h.checksum;
      EVOKE_RETURN_IF_ERROR(visit(record, ok));
    }
    if (h.type != kIdentity) have_identity = false;
    off += kRecordHeaderBytes + RoundUp(h.length, kRecordAlign);
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ accounting

void SegmentLogImpl::AddLive(const PayloadLocation& l) {
  if (std::shared_ptr<Segment> seg = Find(l.segment)) {
    seg->live.fetch_add(static_cast<int64_t>(SegmentRecordBytes(l.length)),
                        std::memory_order_relaxed);
  }
}

void SegmentLogImpl::RemoveLive(const PayloadLocation& l) {
  if (std::shared_ptr<Segment> seg = Find(l.segment)) {
    seg->live.fetch_sub(static_cast<int64_t>(SegmentRecordBytes(l.length)),
                        std::memory_order_relaxed);
  }
}

absl::Status SegmentLogImpl::RemoveSegment(uint64_t segment) {
  absl::MutexLock w(&write_mu_);
  std::shared_ptr<Segment> seg;
  {
    absl::MutexLock lock(&mu_);
    auto it = segments_.find(segment);
    if (it == segments_.end()) {
      return absl::NotFoundError(absl::StrCat("segment ", segment, " is not in the log"));
    }
    if (it->second->active) {
      return absl::FailedPreconditionError(
          absl::StrCat("segment ", segment, " is active; seal it first"));
    }
    seg = it->second;
    segments_.erase(it);
  }
  // Readers holding `seg` keep its file open and finish their reads.
  absl::Status s = io_->Remove(seg->path);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
    absl::MutexLock lock(&mu_);
    segments_[segment] = std::move(seg);
    return s;
  }
  return io_->SyncDir(opts_.dir);
}

std::vector<SegmentInfo> SegmentLogImpl::Segments() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const auto& [id, seg] : segments_) {
    SegmentInfo i;
    i.id = id;
    i.size = seg->size;
    i.valid_end = seg->valid_end.load(std::memory_order_acquire);
    i.live_bytes = static_cast<uint64_t>(std::max<int64_t>(0, seg->live.load()));
    i.active = seg->active;
    i.poisoned = seg->poisoned;
    i.may_hold_tombstones = seg->may_hold_tombstones.load(std::memory_order_relaxed);
    i.max_seq = seg->max_seq.load(std::memory_order_relaxed);
    i.last_payload_seq = seg->last_payload_seq.load(std::memory_order_relaxed);
    i.stream = seg->stream;
    i.created_unix_ms = seg->created_ms;
    out.push_back(i);
  }
  return out;
}

SegmentLogStats SegmentLogImpl::Stats() const {
  SegmentLogStats s;
  {
    absl::ReaderMutexLock lock(&mu_);
    s.segments = segments_.size();
  }
  s.bytes_written = bytes_written_.load();
  s.payload_bytes = payload_bytes_.load();
  s.syncs = syncs_.load();
  s.batches = batches_.load();
  s.read_bytes = read_bytes_.load();
  s.header_mismatches = header_mismatches_.load();
  s.torn_tail_bytes = torn_tail_bytes_.load();
  s.quarantined_segments = quarantined_.load();
  s.identity_bytes = identity_bytes_.load();
  s.tombstones = tombstones_.load();
  s.direct_io = direct_;
  s.io_align = align_;
  return s;
}

uint64_t SegmentLogImpl::FileBytes() const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, seg] : segments_) total += seg->size;
  return total;
}

}  // namespace segment_internal

using segment_internal::SegmentLogImpl;

uint64_t SegmentRecordBytes(uint64_t payload_bytes) {
  return segment_internal::kRecordHeaderBytes +
         segment_internal::RoundUp(payload_bytes, segment_internal::kRecordAlign);
}

absl::StatusOr<std::unique_ptr<SegmentLog>> SegmentLog::Open(const SegmentLogOptions& options,
                                                             std::vector<std::string>* notes) {
  std::vector<std::string> scratch;
  if (notes == nullptr) notes = &scratch;
  std::shared_ptr<SegmentIo> io = options.io != nullptr ? options.io : NewSegmentIo(options.faults);
  auto log = std::make_unique<SegmentLogImpl>(options, std::move(io));
  absl::Status s = log->Init(notes);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("segment log ", options.dir, ": ", s.message()));
  }
  return std::unique_ptr<SegmentLog>(std::move(log));
}

}  // namespace evoke
