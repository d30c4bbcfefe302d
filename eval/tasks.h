// evoke::eval tasks: the generated sessions that the shipped model is trained
// on (models/) and that evoke-eval measures policies with. One generator, in
// C++, for both: training reads its output through evoke-taskgen's shard
// files, so the training text and the evaluation text cannot drift apart.
//
// The language is word-level: every token is a word of Vocabulary() (a fixed,
// generated list; token ids are stable across builds and written into the
// model's GGUF). A session is
//
//   <s> filler ... FACT filler ... FACT ... QUESTION ANSWER ...
//
// with three kinds:
//
//   niah       one needle  "the secret code for ADJ NOUN is D D D ."  at a
//              seed-drawn depth, 0-2 look-alike distractor facts, and at the
//              end "question : what is the secret code for ADJ NOUN ?
//              answer : D D D ."  One probe.
//   multifact  3-8 facts "the code for ADJ NOUN is D D D ." and 1-6
//              look-alike distractors (facts whose key shares one word with a
//              target's) at seed-drawn depths; at the end one question per
//              target, in a random order. One probe per target.
//   agentic    a tool-use trace: tool results that bind keys to values
//              ("tool : port of ADJ NOUN = D D D ."), long tool outputs
//              (filler), and later user turns whose tool call needs a value
//              given thousands of tokens earlier: "user : connect to ADJ NOUN
//              . assistant : call connect ( D D D ) ."  One probe per call.
//
//   recall     (training only) dense drills: up to 24 facts (about 3/4
//              of the tokens), each asked
//              about at a random later point, with look-alike distractors.
//   copy       (training only) spans of filler that occur twice, the second
//              time graded: the induction pattern retrieval builds on. No
//              probes.
//   bind1      (training only) the lookup on its simplest form: facts
//              "NOUN D D D ." (a one-word key, the value right after it),
//              each asked again later, "? NOUN D D D .", its value graded.
//   bind2      (training only) the same with two-word keys ("ADJ NOUN D D D
//              ." and "? ADJ NOUN D D D ."), a third of them look-alikes
//              (one word shared with another key), so the lookup must match
//              both words. The drills come before recall in the curriculum:
//              the value right after its key, and a marked repeat, are the
//              form a lookup is learned on first (models/README.md).
//
// A probe is graded by exact match of its answer tokens (greedy decoding).
// Filler is a random sentence grammar over its own words: no digit and no key
// word ever appears in filler, so the only way to answer is to find the fact.
//
// Seeds. A session is a pure function of (split, kind, length, seed): the
// training split and the evaluation split hash differently, so evaluation
// sessions are never training sessions. Lengths are exact: tokens.size() ==
// length.
#ifndef EVOKE_EVAL_TASKS_H_
#define EVOKE_EVAL_TASKS_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace evoke::eval {

// New kinds go last: a kind's number seeds its sessions.
enum class TaskKind { kNiah, kMultiFact, kAgentic, kRecall, kCopy, kBind1, kBind2 };
enum class Split { kTrain, kEval };

// TaskKindName is "niah", "multifact", "agentic", "recall", "copy", "bind1"
// or "bind2".
absl::string_view TaskKindName(TaskKind kind);
// TrainingOnly: the drills (recall, copy, bind1, bind2), which evoke-eval
// does not measure policies on.
bool TrainingOnly(TaskKind kind);
// ParseTaskKind is the inverse; INVALID_ARGUMENT naming the string.
absl::StatusOr<TaskKind> ParseTaskKind(absl::string_view name);

// The word vocabulary. Ids are indices into words(); ids 0, 1, 2 are
// <unk>, <s> and </s>. Thread-safe (immutable after the first call).
class Vocabulary {
 public:
  static constexpr int32_t kUnk = 0;
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;

  const std::vector<std::string>& words() const { return words_; }
  int32_t size() const { return static_cast<int32_t>(words_.size()); }
  // Id returns the token of `word`; a bug (CHECK) when it is not a word.
  int32_t Id(absl::string_view word) const;
  // Text joins the words of `tokens` with spaces (ids out of range: <unk>).
  std::string Text(const std::vector<int32_t>& tokens, size_t first = 0,
                   size_t last = SIZE_MAX) const;

  // The word classes the generator draws from (token ids).
  const std::vector<int32_t>& digits() const { return digits_; }
  const std::vector<int32_t>& key_adjectives() const { return key_adjectives_; }
  const std::vector<int32_t>& key_nouns() const { return key_nouns_; }

 private:
  friend const Vocabulary& GetVocabulary();
  Vocabulary();
  int32_t Add(absl::string_view word);

  std::vector<std::string> words_;
  std::vector<int32_t> digits_, key_adjectives_, key_nouns_;

 public:
  // Filler word classes (public for the generator; not an API).
  std::vector<int32_t> determiners, nouns, verbs, adjectives, adverbs, prepositions;
};

const Vocabulary& GetVocabulary();

// One graded answer inside a session.
struct Probe {
  // tokens[answer_first, answer_first + answer.size()) are the answer; the
  // model is asked for them after reading tokens[0, answer_first).
  uint32_t answer_first = 0;
  std::vector<int32_t> answer;
  // Where the fact that answers it sits: tokens[fact_first, fact_last).
  uint32_t fact_first = 0;
  uint32_t fact_last = 0;
};

struct Session {
  TaskKind kind = TaskKind::kNiah;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;
  std::vector<Probe> probes;
  // Per token: 0 filler/structure, 1 fact token, 2 answer token (training
  // weights the loss by this).
  std::vector<uint8_t> roles;
  uint32_t n_facts = 0;        // Facts asked about.
  uint32_t n_distractors = 0;  // Look-alike facts never asked about.
};

// The shortest length a session of `kind` can have.
uint32_t MinSessionLength(TaskKind kind);

// MakeSession generates the session (split, kind, length, seed).
// INVALID_ARGUMENT naming `length` when it is below MinSessionLength(kind) or
// above 1 << 20.
absl::StatusOr<Session> MakeSession(Split split, TaskKind kind, uint32_t length, uint64_t seed);

}  // namespace evoke::eval

#endif  // EVOKE_EVAL_TASKS_H_
