// Hash128: a 128-bit identifier (block ids, fingerprint digests).
//
// The declarations live in the client's public header <evoke/hash128.h>
// (include/evoke/hash128.h), which engines include from an installed
// tree; evoke's own code includes this name. One copy of the code.
#ifndef EVOKE_COMMON_HASH128_H_
#define EVOKE_COMMON_HASH128_H_

#include "evoke/hash128.h"

#endif  // EVOKE_COMMON_HASH128_H_
