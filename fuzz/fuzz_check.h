// FUZZ_CHECK(cond): a property a fuzz target checks; when it does not hold,
// names it and aborts, so that libFuzzer keeps the input that broke it.
// (assert would vanish under NDEBUG, which RelWithDebInfo defines.)
#ifndef EVOKE_FUZZ_FUZZ_CHECK_H_
#define EVOKE_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, \
              __LINE__);                                                   \
      abort();                                                             \
    }                                                                      \
  } while (0)

#endif  // EVOKE_FUZZ_FUZZ_CHECK_H_
