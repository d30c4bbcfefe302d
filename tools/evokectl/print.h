// evokectl's printing: blocks, Stat and JSON, as the operator reads them.
#ifndef EVOKE_TOOLS_EVOKECTL_PRINT_H_
#define EVOKE_TOOLS_EVOKECTL_PRINT_H_

#include <string>

#include <google/protobuf/message.h>

#include "evoke/client.h"

namespace evoke::ctl {

// TierName: "pinned", "spill", "breadcrumb" or "-".
std::string TierName(int tier);
// ToJson: one line of JSON, block ids as hex; PrintJson prints it.
std::string ToJson(const google::protobuf::Message& message);
void PrintJson(const google::protobuf::Message& message);
// Layers: "begin-end" of a block's layers.
std::string Layers(const v1::BlockMeta& m);
// PrintBlock: one block's metadata and where its copies are.
void PrintBlock(const v1::BlockInfo& info);
// PrintQuota: one namespace's usage against its quotas, and its cap on
// retention classes.
void PrintQuota(const v1::NamespaceStat& n);
// PrintStat: the daemon's Stat, tier by tier, then the namespaces.
void PrintStat(const v1::StatResponse& s);
// StartupLosses: what the daemon's last open could not bring back, in
// words ("" when nothing): a metadata quarantine, segment files moved aside,
// blocks salvage lost, records that could not be read.
std::string StartupLosses(const v1::DiskHealth& d);

}  // namespace evoke::ctl

#endif  // EVOKE_TOOLS_EVOKECTL_PRINT_H_
