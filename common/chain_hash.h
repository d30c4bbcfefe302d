// Block ids: the prefix token-hash chain and session block addressing.
//
// The declarations live in the client's public header <evoke/chain_hash.h>
// (include/evoke/chain_hash.h), which engines include from an installed
// tree; evoke's own code includes this name. One copy of the code.
#ifndef EVOKE_COMMON_CHAIN_HASH_H_
#define EVOKE_COMMON_CHAIN_HASH_H_

#include "evoke/chain_hash.h"

#endif  // EVOKE_COMMON_CHAIN_HASH_H_
