// Layout fingerprints: what must match for stored KV bytes to be meaningful.
//
// The declarations live in the client's public header <evoke/fingerprint.h>
// (include/evoke/fingerprint.h), which engines include from an installed
// tree; evoke's own code includes this name. One copy of the code.
#ifndef EVOKE_COMMON_FINGERPRINT_H_
#define EVOKE_COMMON_FINGERPRINT_H_

#include "evoke/fingerprint.h"

#endif  // EVOKE_COMMON_FINGERPRINT_H_
