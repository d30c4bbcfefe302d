#include "eval/tasks.h"

#include <algorithm>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace evoke::eval {
namespace {

using ::testing::HasSubstr;

constexpr TaskKind kAll[] = {TaskKind::kNiah, TaskKind::kMultiFact, TaskKind::kAgentic,
                             TaskKind::kRecall};

Session Make(Split split, TaskKind kind, uint32_t length, uint64_t seed) {
  auto s = MakeSession(split, kind, length, seed);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Session{};
}

bool IsDigit(int32_t t) {
  const auto& d = GetVocabulary().digits();
  return std::find(d.begin(), d.end(), t) != d.end();
}

TEST(VocabularyTest, SpecialIdsAndUniqueWords) {
  const Vocabulary& v = GetVocabulary();
  EXPECT_EQ(v.words()[Vocabulary::kUnk], "<unk>");
  EXPECT_EQ(v.words()[Vocabulary::kBos], "<s>");
  EXPECT_EQ(v.words()[Vocabulary::kEos], "</s>");
  std::set<std::string> unique(v.words().begin(), v.words().end());
  EXPECT_EQ(unique.size(), v.words().size());
  EXPECT_EQ(v.digits().size(), 10u);
  EXPECT_GE(v.key_adjectives().size(), 40u);
  EXPECT_GE(v.key_nouns().size(), 40u);
}

TEST(VocabularyTest, PinnedBecauseTheShippedModelDependsOnIt) {
  // models/evoke-recall.gguf was trained on these ids. Changing a word list
  // changes them: retrain the model (models/train.sh) and update this pin.
  const Vocabulary& v = GetVocabulary();
  uint64_t h = 1469598103934665603ULL;
  for (const auto& w : v.words()) {
    for (char c : w) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
  }
  EXPECT_EQ(v.size(), 333);
  EXPECT_EQ(h, 0x84fa78ab801f07b8ULL) << std::hex << "vocabulary hash 0x" << h;
}

TEST(TasksTest, LengthsAreExactAndSessionsDeterministic) {
  for (TaskKind kind : kAll) {
    for (uint32_t length : {MinSessionLength(kind), 256u, 1000u, 4096u}) {
      for (uint64_t seed : {0u, 1u, 77u}) {
        Session a = Make(Split::kEval, kind, length, seed);
        ASSERT_EQ(a.tokens.size(), length) << TaskKindName(kind) << " " << length;
        ASSERT_EQ(a.roles.size(), length);
        EXPECT_EQ(a.tokens[0], Vocabulary::kBos);
        EXPECT_FALSE(a.probes.empty());
        Session b = Make(Split::kEval, kind, length, seed);
        EXPECT_EQ(a.tokens, b.tokens);
      }
    }
  }
}

TEST(TasksTest, SplitsAndSeedsGiveDifferentSessions) {
  for (TaskKind kind : kAll) {
    Session train = Make(Split::kTrain, kind, 2048, 5);
    Session eval = Make(Split::kEval, kind, 2048, 5);
    Session other = Make(Split::kEval, kind, 2048, 6);
    EXPECT_NE(train.tokens, eval.tokens);
    EXPECT_NE(eval.tokens, other.tokens);
  }
}

TEST(TasksTest, ProbesAnswerFromTheirFactAndNowhereElse) {
  const Vocabulary& v = GetVocabulary();
  for (TaskKind kind : kAll) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      Session s = Make(Split::kEval, kind, 3000, seed);
      for (const Probe& p : s.probes) {
        ASSERT_EQ(p.answer.size(), 3u);
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_EQ(s.tokens[p.answer_first + i], p.answer[i]);
          EXPECT_EQ(s.roles[p.answer_first + i], 2);
        }
        ASSERT_LT(p.fact_last, p.answer_first);
        // The fact ends with the three answer digits and ".".
        EXPECT_EQ(s.tokens[p.fact_last - 1], v.Id("."));
        for (size_t i = 0; i < 3; ++i) EXPECT_EQ(s.tokens[p.fact_last - 4 + i], p.answer[i]);
        // The key the question names (two words before "?" or "." in the
        // prompt) is the fact's key, and no other fact binds that key (with
        // the same attribute, in agentic traces) to another value.
        // Questions end "? answer :", calls "( ", restatements (recall
        // drills) "A N is".
        const int32_t before = s.tokens[p.answer_first - 1];
        const uint32_t q_end = p.answer_first - (before == v.Id("(")    ? 6
                                                 : before == v.Id("is") ? 1
                                                                        : 3);
        const int32_t adjective = s.tokens[q_end - 2], noun = s.tokens[q_end - 1];
        const uint32_t key_at = p.fact_last - 7;
        EXPECT_EQ(s.tokens[key_at], adjective) << v.Text(s.tokens, p.fact_first, p.fact_last);
        EXPECT_EQ(s.tokens[key_at + 1], noun);
        int bindings = 0;
        for (uint32_t i = 0; i + 1 < p.answer_first; ++i) {
          if (s.roles[i] == 1 && s.tokens[i] == adjective && s.tokens[i + 1] == noun &&
              (kind != TaskKind::kAgentic || s.tokens[i - 2] == s.tokens[key_at - 2])) {
            ++bindings;
          }
        }
        EXPECT_EQ(bindings, 1) << TaskKindName(kind) << " seed " << seed;
      }
    }
  }
}

TEST(TasksTest, DigitsAndKeyWordsNeverAppearInFiller) {
  const Vocabulary& v = GetVocabulary();
  std::set<int32_t> keys(v.key_adjectives().begin(), v.key_adjectives().end());
  keys.insert(v.key_nouns().begin(), v.key_nouns().end());
  for (TaskKind kind : kAll) {
    Session s = Make(Split::kTrain, kind, 4096, 3);
    // Every digit is a fact's or an answer's; key words appear in facts and
    // in the questions and calls that name them (role 0 there), never in a
    // filler sentence, which is checked by the grammar's word classes.
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (IsDigit(s.tokens[i])) {
        EXPECT_NE(s.roles[i], 0) << i;
      }
    }
    for (int32_t w : v.nouns) EXPECT_EQ(keys.count(w), 0u);
    for (int32_t w : v.adjectives) EXPECT_EQ(keys.count(w), 0u);
  }
}

TEST(TasksTest, LayoutsAndCountsVaryPerSeed) {
  for (TaskKind kind : {TaskKind::kNiah, TaskKind::kMultiFact, TaskKind::kAgentic}) {
    std::set<uint32_t> first_fact, n_facts, n_distractors;
    for (uint64_t seed = 0; seed < 30; ++seed) {
      Session s = Make(Split::kEval, kind, 4096, seed);
      uint32_t first = s.probes[0].fact_first;
      for (const Probe& p : s.probes) first = std::min(first, p.fact_first);
      first_fact.insert(first / 64);
      n_facts.insert(s.n_facts);
      n_distractors.insert(s.n_distractors);
    }
    EXPECT_GE(first_fact.size(), 10u) << TaskKindName(kind);
    if (kind != TaskKind::kNiah) {
      EXPECT_GE(n_facts.size(), 3u) << TaskKindName(kind);
    }
    EXPECT_GE(n_distractors.size(), 2u) << TaskKindName(kind);
  }
}

TEST(TasksTest, CopyDrillsRepeatSpansAndGradeTheSecondOccurrence) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Session s = Make(Split::kTrain, TaskKind::kCopy, 512, seed);
    ASSERT_EQ(s.tokens.size(), 512u);
    EXPECT_TRUE(s.probes.empty());
    // Every graded token continues a span whose earlier occurrence (found by
    // its two ungraded lead tokens and the graded ones so far) predicts it.
    uint32_t graded = 0;
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.roles[i] != 2) continue;
      ++graded;
      size_t start = i;
      while (start > 0 && s.roles[start - 1] == 2) --start;
      ASSERT_GE(start, 2u);
      start -= 2;  // The span's first two tokens are not graded.
      const size_t offset = i - start;
      bool found = false;
      for (size_t j = 0; j + offset < start && !found; ++j) {
        found = std::equal(s.tokens.begin() + start, s.tokens.begin() + i + 1,
                           s.tokens.begin() + j);
      }
      EXPECT_TRUE(found) << "graded token " << i << " repeats nothing before it";
    }
    EXPECT_GT(graded, 100u);
  }
}

TEST(TasksTest, BindDrillsRestateEachFactWithItsValueGraded) {
  for (TaskKind kind : {TaskKind::kBind1, TaskKind::kBind2}) {
    const uint32_t key_words = kind == TaskKind::kBind1 ? 1 : 2;
    uint32_t look_alikes = 0;
    for (uint32_t length : {MinSessionLength(kind), 128u, 512u}) {
      for (uint64_t seed = 0; seed < 10; ++seed) {
        Session s = Make(Split::kTrain, kind, length, seed);
        ASSERT_EQ(s.tokens.size(), length);
        EXPECT_TRUE(TrainingOnly(kind));
        EXPECT_EQ(s.probes.size(), s.n_facts) << "every fact is stated again";
        for (const Probe& p : s.probes) {
          // The fact is "[ADJ] NOUN D D D ." and the repeat, "? [ADJ] NOUN",
          // names its key right before the graded value.
          ASSERT_EQ(p.fact_last - p.fact_first, key_words + 4);
          ASSERT_LT(p.fact_last, p.answer_first);
          for (uint32_t i = 0; i < 3; ++i) {
            EXPECT_EQ(s.tokens[p.fact_first + key_words + i], p.answer[i]);
            EXPECT_EQ(s.tokens[p.answer_first + i], p.answer[i]);
            EXPECT_EQ(s.roles[p.answer_first + i], 2);
            EXPECT_EQ(s.roles[p.fact_first + key_words + i], 1);
          }
          for (uint32_t i = 0; i < key_words; ++i) {
            EXPECT_EQ(s.tokens[p.answer_first - key_words + i], s.tokens[p.fact_first + i]);
          }
          EXPECT_EQ(s.tokens[p.answer_first - key_words - 1], GetVocabulary().Id("?"));
          // No other fact has the same key; look-alikes share one word.
          int same = 0;
          for (const Probe& q : s.probes) {
            const int32_t* a = &s.tokens[p.fact_first];
            const int32_t* b = &s.tokens[q.fact_first];
            const int shared = (a[0] == b[0]) + (key_words == 2 && a[1] == b[1]);
            same += shared == static_cast<int>(key_words);
            if (&p != &q && key_words == 2 && shared == 1) ++look_alikes;
          }
          EXPECT_EQ(same, 1) << TaskKindName(kind) << " seed " << seed;
        }
      }
    }
    if (kind == TaskKind::kBind2) {
      EXPECT_GT(look_alikes, 20u);
    }
  }
  EXPECT_FALSE(TrainingOnly(TaskKind::kMultiFact));
}

TEST(TasksTest, BadArgumentsAreNamed) {
  auto kind = ParseTaskKind("needle");
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(kind.status().message()), HasSubstr("needle"));
  auto s = MakeSession(Split::kEval, TaskKind::kMultiFact, 10, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("length 10"));
}

}  // namespace
}  // namespace evoke::eval
