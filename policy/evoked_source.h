// evoke::policy::EvokedRecoverySource: evoked's Recover as a RecoverySource.
// (Being written.)
