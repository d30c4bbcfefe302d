// The crash trial's expected-state model on its own: which observations it
// accepts after each sequence of acknowledged and unacknowledged operations.
#include "tests/chaos/crash_model.h"

#include "gtest/gtest.h"

namespace evoke::chaos {
namespace {

constexpr std::optional<uint32_t> kAbsent = std::nullopt;

TEST(ExpectedStateTest, NeverSavedIsAbsentAndAnythingServedIsAPhantom) {
  ExpectedState m(2);
  EXPECT_EQ(m.Classify(0, m.AllowedLive(0), kAbsent), Verdict::kOk);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), 1u), Verdict::kPhantom);
}

TEST(ExpectedStateTest, AcknowledgedSaveMayBeLostOnlyByACrash) {
  ExpectedState m(1);
  EXPECT_EQ(m.BeginSave(0, /*durable=*/false), 1u);
  m.AckSave(0);
  EXPECT_EQ(m.presence(0), Presence::kVolatile);
  EXPECT_EQ(m.Classify(0, m.AllowedLive(0), 1u), Verdict::kOk);
  EXPECT_EQ(m.Classify(0, m.AllowedLive(0), kAbsent), Verdict::kLostLive);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), kAbsent), Verdict::kOk);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), 1u), Verdict::kOk);
}

TEST(ExpectedStateTest, DurableSaveMustSurvive) {
  ExpectedState m(1);
  m.BeginSave(0, /*durable=*/true);
  m.AckSave(0);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), kAbsent), Verdict::kLostDurable);
  // A later non-durable re-save of the same bytes keeps it durable.
  EXPECT_EQ(m.BeginSave(0, false), 1u);
  m.AckSave(0);
  EXPECT_EQ(m.presence(0), Presence::kDurable);
}

TEST(ExpectedStateTest, SaveInFlightAtTheCrashIsOldOrNew) {
  ExpectedState m(1);
  m.BeginSave(0, true);
  m.AckSave(0);
  m.BeginDelete(0);
  m.AckDelete(0);
  EXPECT_EQ(m.BeginSave(0, /*durable=*/true), 2u);  // Never acknowledged.
  EXPECT_TRUE(m.Busy(0));
  const Allowed a = m.AllowedAfterCrash(0);
  EXPECT_EQ(m.Classify(0, a, kAbsent), Verdict::kOk);
  EXPECT_EQ(m.Classify(0, a, 2u), Verdict::kOk);
  EXPECT_EQ(m.Classify(0, a, 1u), Verdict::kResurrected);
}

TEST(ExpectedStateTest, DeleteInFlightAtTheCrashIsOldOrNew) {
  ExpectedState m(1);
  m.BeginSave(0, true);
  m.AckSave(0);
  m.BeginDelete(0);
  m.FailDelete(0);
  EXPECT_TRUE(m.Busy(0));
  const Allowed a = m.AllowedAfterCrash(0);
  EXPECT_EQ(m.Classify(0, a, kAbsent), Verdict::kOk);
  EXPECT_EQ(m.Classify(0, a, 1u), Verdict::kOk);
  m.Resolve(0, kAbsent);
  EXPECT_FALSE(m.Busy(0));
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), 1u), Verdict::kResurrected);
}

TEST(ExpectedStateTest, AcknowledgedDeleteStaysDeleted) {
  ExpectedState m(1);
  m.BeginSave(0, false);
  m.AckSave(0);
  m.BeginDelete(0);
  m.AckDelete(0);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), 1u), Verdict::kResurrected);
  EXPECT_EQ(m.Classify(0, m.AllowedLive(0), 1u), Verdict::kResurrected);
}

TEST(ExpectedStateTest, FlushMakesEarlierSavesDurableButNotLaterChanges) {
  ExpectedState m(3);
  for (size_t i = 0; i < 3; ++i) {
    m.BeginSave(i, false);
    m.AckSave(i);
  }
  ExpectedState::FlushTicket ticket = m.BeginFlush();
  // While the Flush runs, slot 1 is deleted and saved anew, slot 2 deleted.
  m.BeginDelete(1);
  m.AckDelete(1);
  m.BeginSave(1, false);
  m.AckSave(1);
  m.BeginDelete(2);
  m.AckDelete(2);
  EXPECT_EQ(m.AckFlush(ticket), 1u);
  EXPECT_EQ(m.presence(0), Presence::kDurable);
  EXPECT_EQ(m.presence(1), Presence::kVolatile);
  EXPECT_EQ(m.presence(2), Presence::kAbsent);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), kAbsent), Verdict::kLostDurable);
  EXPECT_EQ(m.Classify(1, m.AllowedAfterCrash(1), kAbsent), Verdict::kOk);
}

TEST(ExpectedStateTest, WhatARestartShowsIsDurable) {
  ExpectedState m(1);
  m.BeginSave(0, false);
  m.AckSave(0);
  m.Resolve(0, 1u);  // Seen after a restart: it is in tier 2.
  EXPECT_EQ(m.presence(0), Presence::kDurable);
  EXPECT_EQ(m.Classify(0, m.AllowedAfterCrash(0), kAbsent), Verdict::kLostDurable);
  EXPECT_NE(m.Describe(0).find("durable v1"), std::string::npos) << m.Describe(0);
}

}  // namespace
}  // namespace evoke::chaos
