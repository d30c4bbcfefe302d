// Futex wait and wake on a 32-bit word of shared memory (a MAP_SHARED
// mapping seen by two processes: the shared, not the private, futex ops).
#ifndef EVOKE_COMMON_FUTEX_H_
#define EVOKE_COMMON_FUTEX_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "absl/time/time.h"

namespace evoke {

// FutexWait sleeps while *word == expected, for at most `timeout` (or until
// a FutexWake, a signal, or a spurious wake-up: callers re-check).
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// FutexWake wakes every thread (of any process) sleeping on `word`.
inline void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

// CpuRelax tells the core that this is a spin-wait loop.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace evoke

#endif  // EVOKE_COMMON_FUTEX_H_
