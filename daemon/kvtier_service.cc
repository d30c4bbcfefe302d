#include "daemon/kvtier_service.h"

#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace evoke {
namespace {

// ToGrpc translates an absl::Status for the wire; the codes share numbering.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  if (s.code() == absl::StatusCode::kDataLoss ||
      s.code() == absl::StatusCode::kInternal ||
      s.code() == absl::StatusCode::kUnavailable) {
    EVOKE_LOG_WARNING(s.ToString());
  } else {
    EVOKE_LOG_DEBUG(s.ToString());
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

absl::Time DeadlineOf(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() -
                      std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// Finishes on the calling (reactor) thread: for memory-only work.
template <typename Fn>
grpc::ServerUnaryReactor* FinishInline(grpc::CallbackServerContext* context,
                                       Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(fn()));
  return reactor;
}

// Runs `fn` on the executor and finishes the reactor from there.
template <typename Fn>
grpc::ServerUnaryReactor* FinishOnExecutor(Executor* executor,
                                           grpc::CallbackServerContext* context,
                                           Fn fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  executor->Submit([reactor, fn = std::move(fn)]() mutable {
    reactor->Finish(ToGrpc(fn()));
  });
  return reactor;
}

}  // namespace

KvTierService::KvTierService(TierManager* tiers, Executor* executor,
                             KvTierServiceOptions options)
    : tiers_(tiers), executor_(executor), options_(std::move(options)) {}

grpc::ServerUnaryReactor* KvTierService::Save(grpc::CallbackServerContext* context,
                                              const v1::SaveRequest* request,
                                              v1::SaveResponse* response) {
  const absl::Time deadline = DeadlineOf(context);
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    EVOKE_RETURN_IF_ERROR(ValidateSaveRequest(*request, options_.limits));
    std::vector<SaveItem> items;
    items.reserve(request->blocks_size());
    for (const v1::SaveBlock& block : request->blocks()) {
      items.push_back(SaveItem{&block.meta(), block.inline_bytes(), block.pin()});
    }
    EVOKE_ASSIGN_OR_RETURN(std::vector<v1::SaveResult> results,
                           tiers_->Save(items, request->durable(), deadline));
    response->mutable_results()->Reserve(results.size());
    for (v1::SaveResult& r : results) *response->add_results() = std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Load(grpc::CallbackServerContext* context,
                                              const v1::LoadRequest* request,
                                              v1::LoadResponse* response) {
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(std::vector<BlockId> ids,
                           ValidateLoadRequest(*request, options_.limits));
    for (size_t i = 0; i < ids.size(); ++i) response->add_blocks();
    // Leave room for metadata in the response message.
    const uint64_t budget = options_.max_message_bytes - (1u << 20);
    uint64_t total = 0;
    std::vector<v1::BlockMeta> metas;
    std::vector<LoadedInfo> infos;
    absl::Status s = tiers_->Load(
        ids, request->fingerprint(),
        [&](size_t index, const v1::BlockMeta& meta) -> absl::StatusOr<uint8_t*> {
          total += meta.payload_bytes();
          if (total > budget) {
            return absl::ResourceExhaustedError(absl::StrCat(
                "ids: the payloads of ids[0..", index, "] add up to ",
                FormatByteSize(total), ", over the response limit of ",
                FormatByteSize(budget),
                " (--max-message-bytes); load fewer blocks per call"));
          }
          std::string* bytes = response->mutable_blocks(index)->mutable_inline_bytes();
          bytes->resize(meta.payload_bytes());
          return reinterpret_cast<uint8_t*>(bytes->data());
        },
        &metas, &infos);
    if (!s.ok()) {
      response->Clear();
      return s;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::LoadedBlock* block = response->mutable_blocks(i);
      *block->mutable_meta() = std::move(metas[i]);
      block->set_served_from(infos[i].served_from);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Lookup(grpc::CallbackServerContext* context,
                                                const v1::LookupRequest* request,
                                                v1::LookupResponse* response) {
  return FinishInline(context, [&]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, false));
    const std::vector<v1::Tier> tiers = tiers_->Lookup(ids);
    response->set_n_present(tiers.size());
    for (v1::Tier t : tiers) response->add_tiers(t);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Delete(grpc::CallbackServerContext* context,
                                                const v1::DeleteRequest* request,
                                                v1::DeleteResponse* response) {
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    EVOKE_RETURN_IF_ERROR(tiers_->Delete(ids));
    response->set_n_deleted(ids.size());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::DropSession(
    grpc::CallbackServerContext* context, const v1::DropSessionRequest* request,
    v1::DropSessionResponse* response) {
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    if (request->namespace_().empty()) {
      return absl::InvalidArgumentError("namespace: is required");
    }
    if (request->session_id().empty()) {
      return absl::InvalidArgumentError("session_id: is required");
    }
    EVOKE_ASSIGN_OR_RETURN(
        uint32_t n, tiers_->DropSession(request->namespace_(), request->session_id()));
    response->set_n_deleted(n);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Pin(grpc::CallbackServerContext* context,
                                             const v1::PinRequest* request,
                                             v1::PinResponse*) {
  const absl::Time deadline = DeadlineOf(context);
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    return tiers_->Pin(ids, deadline);
  });
}

grpc::ServerUnaryReactor* KvTierService::Unpin(grpc::CallbackServerContext* context,
                                               const v1::PinRequest* request,
                                               v1::PinResponse*) {
  return FinishInline(context, [&]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    return tiers_->Unpin(ids);
  });
}

grpc::ServerUnaryReactor* KvTierService::List(grpc::CallbackServerContext* context,
                                              const v1::ListRequest* request,
                                              v1::ListResponse* response) {
  return FinishInline(context, [&]() -> absl::Status {
    const uint32_t page_size = request->page_size() == 0 ? 100 : request->page_size();
    if (page_size > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_size: ", page_size, " exceeds 1000"));
    }
    if (!request->session_id().empty() && request->namespace_().empty()) {
      return absl::InvalidArgumentError(
          "namespace: is required when session_id is given");
    }
    if (!v1::Tier_IsValid(request->tier())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier: unknown tier ", static_cast<int>(request->tier())));
    }
    BlockId after;
    const bool has_after = !request->page_token().empty();
    if (has_after) {
      absl::StatusOr<BlockId> parsed = BlockId::FromHex(request->page_token());
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page_token: not a token from ListResponse (", parsed.status().message(),
            ")"));
      }
      after = *parsed;
    }
    ListFilter filter;
    filter.ns = request->namespace_();
    filter.session_id = request->session_id();
    filter.tier = request->tier();
    bool more = false;
    std::vector<v1::BlockInfo> blocks =
        tiers_->List(filter, after, has_after, page_size, &more);
    for (v1::BlockInfo& b : blocks) *response->add_blocks() = std::move(b);
    if (more && response->blocks_size() > 0) {
      response->set_next_page_token(
          BlockId::FromBytes(response->blocks().rbegin()->meta().id())->ToHex());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Describe(grpc::CallbackServerContext* context,
                                                  const v1::DescribeRequest* request,
                                                  v1::BlockInfo* response) {
  return FinishInline(context, [&]() -> absl::Status {
    absl::StatusOr<BlockId> id = BlockId::FromBytes(request->id());
    if (!id.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("id: ", id.status().message()));
    }
    EVOKE_ASSIGN_OR_RETURN(*response, tiers_->Describe(*id));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Stat(grpc::CallbackServerContext* context,
                                              const v1::StatRequest*,
                                              v1::StatResponse* response) {
  return FinishInline(context, [&]() -> absl::Status {
    tiers_->Stats(response);
    response->set_version(options_.version);
    response->set_data_dir(options_.data_dir);
    response->set_pid(static_cast<uint32_t>(getpid()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Verify(grpc::CallbackServerContext* context,
                                                const v1::VerifyRequest* request,
                                                v1::VerifyResponse* response) {
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 0, options_.limits.max_ids, true));
    EVOKE_ASSIGN_OR_RETURN(*response, tiers_->Verify(ids));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Flush(grpc::CallbackServerContext* context,
                                               const v1::FlushRequest* request,
                                               v1::FlushResponse* response) {
  return FinishOnExecutor(executor_, context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(*response, tiers_->Flush(request->evict()));
    return absl::OkStatus();
  });
}

}  // namespace evoke
