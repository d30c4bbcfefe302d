#include "eval/tasks.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstdio>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace evoke::eval {
namespace {

// ---------------------------------------------------------------- words --

constexpr std::array kStructure = {
    ".", ",", "?", ":", "=", "(", ")", "the", "a", "is", "of", "to", "and", "for", "what",
    "code", "secret", "question", "answer", "tool", "user", "assistant", "output", "call",
    "port", "id", "pin", "connect", "open", "unlock"};
constexpr std::array kDigits = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
constexpr std::array kKeyAdjectives = {
    "red",     "blue",   "green",   "yellow", "purple",   "orange", "silver", "golden",
    "black",   "white",  "gray",    "brown",  "pink",     "violet", "amber",  "crimson",
    "azure",   "scarlet", "ivory",  "copper", "bronze",   "emerald", "jade",  "coral",
    "navy",    "olive",  "teal",    "cyan",   "magenta",  "maroon", "indigo", "ruby",
    "sapphire", "cobalt", "beige",  "khaki",  "lilac",    "plum",   "rust",   "sandy",
    "pearl",   "onyx",   "opal",    "topaz",  "slate",    "ashen",  "frosty", "mossy"};
constexpr std::array kKeyNouns = {
    "fox",   "owl",    "wolf",   "bear",   "hawk",  "deer",   "lynx",   "crow",
    "frog",  "toad",   "swan",   "duck",   "goat",  "lamb",   "mole",   "mouse",
    "rat",   "seal",   "shark",  "whale",  "otter", "tiger",  "lion",   "zebra",
    "camel", "llama",  "eagle",  "raven",  "robin", "finch",  "heron",  "crane",
    "stork", "viper",  "cobra",  "gecko",  "lizard", "moth",  "wasp",   "bee",
    "ant",   "beetle", "spider", "crab",   "squid", "eel",    "trout",  "salmon",
    "bison", "moose",  "panda",  "koala",  "badger", "ferret", "hare",  "falcon"};
constexpr std::array kDeterminers = {"this", "that", "every", "some", "each", "another", "her",
                                     "his", "our", "their"};
constexpr std::array kNouns = {
    "house",   "river",   "table",   "garden",  "window",  "market",  "city",    "road",
    "bridge",  "tower",   "forest",  "mountain", "village", "letter", "story",   "song",
    "book",    "paper",   "stone",   "tree",    "field",   "boat",    "train",   "car",
    "ship",    "cloud",   "storm",   "rain",    "wind",    "lamp",    "shadow",  "door",
    "wall",    "floor",   "room",    "street",  "school",  "office",  "kitchen", "bottle",
    "glass",   "plate",   "chair",   "clock",   "coin",    "child",   "teacher", "farmer",
    "doctor",  "writer",  "painter", "sailor",  "soldier", "king",    "queen",   "friend",
    "stranger", "neighbor", "student", "worker", "basket", "candle",  "mirror",  "ladder",
    "harbor",  "valley",  "island",  "desert",  "meadow",  "castle",  "engine",  "wheel"};
constexpr std::array kVerbs = {
    "sees",    "finds",   "builds",  "opens",   "closes",  "carries", "moves",   "watches",
    "follows", "paints",  "writes",  "reads",   "likes",   "helps",   "keeps",   "leaves",
    "takes",   "brings",  "makes",   "holds",   "pulls",   "pushes",  "cleans",  "fixes",
    "breaks",  "covers",  "enters",  "crosses", "visits",  "remembers", "forgets", "sells",
    "buys",    "draws",   "hides",   "lifts",   "counts",  "wants",   "needs",   "loves"};
constexpr std::array kAdjectives = {
    "small",  "large",  "old",    "new",    "quiet",  "loud",   "bright", "dark",
    "warm",   "cold",   "heavy",  "soft",   "hard",   "tall",   "short",  "narrow",
    "wide",   "empty",  "full",   "busy",   "calm",   "strange", "simple", "rough",
    "smooth", "clean",  "dirty",  "early",  "late",   "happy",  "tired",  "famous"};
constexpr std::array kAdverbs = {"slowly", "quickly", "often",  "rarely", "quietly",
                                 "carefully", "gently", "suddenly", "again", "always",
                                 "never",  "today",   "there",  "here",   "soon", "later"};
constexpr std::array kPrepositions = {"in",     "on",   "under",   "over",   "near",
                                      "behind", "beside", "across", "through", "along",
                                      "into",   "from", "with",    "without", "after",
                                      "before"};

// ------------------------------------------------------------------ rng --

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// xoshiro256**, seeded through SplitMix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& w : s_) w = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n), n > 0 (Lemire's multiply; the bias is < n / 2^64).
  uint32_t Below(uint32_t n) {
    return static_cast<uint32_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
  // Uniform in [lo, hi].
  uint32_t Between(uint32_t lo, uint32_t hi) { return lo + Below(hi - lo + 1); }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Below(static_cast<uint32_t>(v.size()))];
  }
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(static_cast<uint32_t>(i))]);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_;
};

uint64_t SessionSeed(Split split, TaskKind kind, uint32_t length, uint64_t seed) {
  uint64_t x = 0x6576'6f6b'6574'736bULL;  // "evoketsk"
  x ^= (split == Split::kTrain ? 0x7472'6169'6eULL : 0x6576'616c'7375ULL);
  uint64_t h = SplitMix64(x);
  h ^= static_cast<uint64_t>(kind) * 0x100000001b3ULL;
  uint64_t y = h ^ (static_cast<uint64_t>(length) << 32);
  h = SplitMix64(y);
  uint64_t z = h ^ seed;
  return SplitMix64(z);
}

// ------------------------------------------------------------ builders --

struct Key {
  int32_t adjective;
  int32_t noun;
  int32_t attribute;  // agentic only: port / id / pin.
  bool operator==(const Key& o) const {
    return adjective == o.adjective && noun == o.noun && attribute == o.attribute;
  }
};

struct Fact {
  Key key;
  std::array<int32_t, 3> value;
  bool target = false;
};

class Builder {
 public:
  Builder(Rng& rng, Session& s) : rng_(rng), s_(s), v_(GetVocabulary()) {}

  void Word(absl::string_view w, uint8_t role = 0) { Token(v_.Id(w), role); }
  void Token(int32_t t, uint8_t role = 0) {
    s_.tokens.push_back(t);
    s_.roles.push_back(role);
  }
  uint32_t size() const { return static_cast<uint32_t>(s_.tokens.size()); }

  // Filler appends exactly n tokens of sentences (the last may be cut short
  // and end with "."). In agentic style a sentence may open a turn.
  void Filler(uint32_t n, bool agentic) {
    std::vector<int32_t> tokens;
    FillerTokens(n, agentic, &tokens);
    for (int32_t t : tokens) Token(t);
  }
  // FillerTokens: the same n tokens, into *out instead of the session.
  void FillerTokens(uint32_t n, bool agentic, std::vector<int32_t>* out) {
    std::vector<int32_t> sentence;
    while (n > 0) {
      sentence.clear();
      Sentence(agentic, sentence);
      if (sentence.size() > n) {
        sentence.resize(n);
        sentence.back() = v_.Id(".");
      }
      out->insert(out->end(), sentence.begin(), sentence.end());
      n -= static_cast<uint32_t>(sentence.size());
    }
  }

  void Value(const std::array<int32_t, 3>& value, uint8_t role) {
    for (int32_t d : value) Token(d, role);
  }

 private:
  void NounPhrase(std::vector<int32_t>& out) {
    out.push_back(rng_.Chance(0.5) ? v_.Id("the")
                                   : (rng_.Chance(0.4) ? v_.Id("a") : rng_.Pick(v_.determiners)));
    if (rng_.Chance(0.4)) out.push_back(rng_.Pick(v_.adjectives));
    out.push_back(rng_.Pick(v_.nouns));
  }
  void Clause(std::vector<int32_t>& out) {
    NounPhrase(out);
    out.push_back(rng_.Pick(v_.verbs));
    if (rng_.Chance(0.6)) NounPhrase(out);
    if (rng_.Chance(0.4)) {
      out.push_back(rng_.Pick(v_.prepositions));
      NounPhrase(out);
    }
    if (rng_.Chance(0.25)) out.push_back(rng_.Pick(v_.adverbs));
  }
  void Sentence(bool agentic, std::vector<int32_t>& out) {
    if (agentic && rng_.Chance(0.3)) {
      switch (rng_.Below(3)) {
        case 0:
          for (auto w : {"tool", ":", "output", ":"}) out.push_back(v_.Id(w));
          break;
        case 1:
          for (auto w : {"user", ":"}) out.push_back(v_.Id(w));
          break;
        default:
          for (auto w : {"assistant", ":"}) out.push_back(v_.Id(w));
      }
    }
    Clause(out);
    if (rng_.Chance(0.2)) {
      out.push_back(v_.Id(","));
      out.push_back(v_.Id("and"));
      Clause(out);
    }
    out.push_back(v_.Id("."));
  }

  Rng& rng_;
  Session& s_;
  const Vocabulary& v_;
};

// Draws `n_targets` distinct keys and `n_distractors` look-alikes (sharing
// the adjective or the noun with a target, or in agentic sessions also the
// whole key with another attribute), all with distinct values.
std::vector<Fact> DrawFacts(Rng& rng, uint32_t n_targets, uint32_t n_distractors, bool agentic) {
  const Vocabulary& v = GetVocabulary();
  static const std::array<int32_t, 3> kAttributes = {v.Id("port"), v.Id("id"), v.Id("pin")};
  std::vector<Fact> facts;
  absl::flat_hash_set<uint64_t> keys;
  absl::flat_hash_set<uint32_t> values;
  auto key_code = [](const Key& k) {
    return (static_cast<uint64_t>(k.adjective) << 40) | (static_cast<uint64_t>(k.noun) << 20) |
           static_cast<uint64_t>(k.attribute);
  };
  // Keys differ in (adjective, noun) among targets; agentic targets' calls
  // name the key, so two targets must not share (adjective, noun) either.
  absl::flat_hash_set<uint64_t> names;
  auto name_code = [](const Key& k) {
    return (static_cast<uint64_t>(k.adjective) << 32) | static_cast<uint64_t>(k.noun);
  };
  auto new_value = [&]() {
    for (;;) {
      const uint32_t x = rng.Below(1000);
      if (values.insert(x).second) {
        return std::array<int32_t, 3>{v.digits()[x / 100], v.digits()[(x / 10) % 10],
                                      v.digits()[x % 10]};
      }
    }
  };
  while (facts.size() < n_targets) {
    Key k{rng.Pick(v.key_adjectives()), rng.Pick(v.key_nouns()),
          agentic ? kAttributes[rng.Below(3)] : 0};
    if (!names.insert(name_code(k)).second) continue;
    keys.insert(key_code(k));
    facts.push_back(Fact{k, new_value(), true});
  }
  for (uint32_t d = 0; d < n_distractors;) {
    const Key& t = facts[rng.Below(n_targets)].key;
    Key k = t;
    const uint32_t how = rng.Below(agentic ? 3 : 2);
    if (how == 0) k.noun = rng.Pick(v.key_nouns());
    if (how == 1) k.adjective = rng.Pick(v.key_adjectives());
    if (how == 2) {
      const uint32_t at = static_cast<uint32_t>(
          std::find(kAttributes.begin(), kAttributes.end(), t.attribute) - kAttributes.begin());
      k.attribute = kAttributes[(at + 1 + rng.Below(2)) % 3];
    }
    if (k == t || keys.contains(key_code(k))) continue;
    // A distractor must not be the (adjective, noun) of another target with
    // the same attribute: that would change a target's answer.
    keys.insert(key_code(k));
    facts.push_back(Fact{k, new_value(), false});
    ++d;
  }
  return facts;
}

// Sorted uniform cut points in [lo, hi].
std::vector<uint32_t> CutPoints(Rng& rng, size_t n, uint32_t lo, uint32_t hi) {
  std::vector<uint32_t> cuts(n);
  for (auto& c : cuts) c = rng.Between(lo, hi);
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Token counts of the fixed parts.
constexpr uint32_t kFactLen = 10;          // the code for A N is D D D .
constexpr uint32_t kNeedleLen = 11;        // the secret code for A N is D D D .
constexpr uint32_t kQuestionLen = 16;      // question : what is the code for A N ? answer : D D D .
constexpr uint32_t kNeedleQuestionLen = 17;
constexpr uint32_t kToolFactLen = 11;      // tool : port of A N = D D D .
constexpr uint32_t kCallLen = 17;          // user : connect to A N . assistant : call connect ( D D D ) .
constexpr uint32_t kMinFiller = 16;

int32_t CallFor(int32_t attribute) {
  const Vocabulary& v = GetVocabulary();
  if (attribute == v.Id("port")) return v.Id("connect");
  if (attribute == v.Id("id")) return v.Id("open");
  return v.Id("unlock");
}

void EmitFact(Builder& b, const Fact& f, bool needle, bool tool, std::vector<uint32_t>* first) {
  const Vocabulary& v = GetVocabulary();
  first->push_back(b.size());
  if (tool) {
    b.Word("tool");
    b.Word(":");
    b.Token(f.key.attribute, 1);
    b.Word("of", 1);
    b.Token(f.key.adjective, 1);
    b.Token(f.key.noun, 1);
    b.Word("=", 1);
  } else {
    b.Word("the");
    if (needle) b.Word("secret");
    b.Word("code", 1);
    b.Word("for", 1);
    b.Token(f.key.adjective, 1);
    b.Token(f.key.noun, 1);
    b.Word("is", 1);
  }
  b.Value(f.value, 1);
  b.Token(v.Id("."));
}

// Question and answer; returns the probe.
Probe EmitQuestion(Builder& b, const Fact& f, bool needle, uint32_t fact_first, uint32_t fact_len) {
  for (auto w : {"question", ":", "what", "is", "the"}) b.Word(w);
  if (needle) b.Word("secret");
  b.Word("code");
  b.Word("for");
  b.Token(f.key.adjective);
  b.Token(f.key.noun);
  for (auto w : {"?", "answer", ":"}) b.Word(w);
  Probe p;
  p.answer_first = b.size();
  p.answer.assign(f.value.begin(), f.value.end());
  p.fact_first = fact_first;
  p.fact_last = fact_first + fact_len;
  b.Value(f.value, 2);
  b.Word(".");
  return p;
}

Probe EmitCall(Builder& b, const Fact& f, uint32_t fact_first) {
  const int32_t call = CallFor(f.key.attribute);
  b.Word("user");
  b.Word(":");
  b.Token(call);
  b.Word("to");
  b.Token(f.key.adjective);
  b.Token(f.key.noun);
  for (auto w : {".", "assistant", ":", "call"}) b.Word(w);
  b.Token(call);
  b.Word("(");
  Probe p;
  p.answer_first = b.size();
  p.answer.assign(f.value.begin(), f.value.end());
  p.fact_first = fact_first;
  p.fact_last = fact_first + kToolFactLen;
  b.Value(f.value, 2);
  b.Word(")");
  b.Word(".");
  return p;
}

// How many items of `per_item` tokens fit in `share` of a session.
uint32_t Fit(uint32_t length, double share, uint32_t per_item) {
  return static_cast<uint32_t>(share * length / per_item);
}

void MakeNiahOrMultiFact(Rng& rng, uint32_t length, bool niah, Session& s) {
  const uint32_t fact_len = niah ? kNeedleLen : kFactLen;
  const uint32_t question_len = niah ? kNeedleQuestionLen : kQuestionLen;
  uint32_t n_targets = 1;
  uint32_t n_distractors;
  if (niah) {
    n_distractors = std::min<uint32_t>(rng.Between(0, 2), Fit(length, 0.25, fact_len));
  } else {
    n_targets = std::clamp<uint32_t>(std::min<uint32_t>(rng.Between(3, 8),
                                                        Fit(length, 0.4, fact_len + question_len)),
                                     1, 8);
    n_distractors = std::min<uint32_t>(rng.Between(1, 6), Fit(length, 0.2, fact_len));
  }
  std::vector<Fact> facts = DrawFacts(rng, n_targets, n_distractors, /*agentic=*/false);
  s.n_facts = n_targets;
  s.n_distractors = n_distractors;
  const uint32_t fixed = 1 + static_cast<uint32_t>(facts.size()) * fact_len + n_targets * question_len;
  const uint32_t filler = length - fixed;
  rng.Shuffle(facts);
  const std::vector<uint32_t> cuts = CutPoints(rng, facts.size(), 0, filler);
  Builder b(rng, s);
  b.Token(Vocabulary::kBos);
  std::vector<uint32_t> fact_first;
  uint32_t done = 0;
  for (size_t i = 0; i < facts.size(); ++i) {
    b.Filler(cuts[i] - done, false);
    done = cuts[i];
    EmitFact(b, facts[i], niah, false, &fact_first);
  }
  b.Filler(filler - done, false);
  std::vector<size_t> order;
  for (size_t i = 0; i < facts.size(); ++i) {
    if (facts[i].target) order.push_back(i);
  }
  rng.Shuffle(order);
  for (size_t i : order) {
    s.probes.push_back(EmitQuestion(b, facts[i], niah, fact_first[i], fact_len));
  }
}

// A fact stated again later, its value graded: "the code for A N is D D D ."
// (the plain induction pattern: what followed this key before follows it
// again).
Probe EmitRestatement(Builder& b, const Fact& f, uint32_t fact_first) {
  b.Word("the");
  b.Word("code");
  b.Word("for");
  b.Token(f.key.adjective);
  b.Token(f.key.noun);
  b.Word("is");
  Probe p;
  p.answer_first = b.size();
  p.answer.assign(f.value.begin(), f.value.end());
  p.fact_first = fact_first;
  p.fact_last = fact_first + kFactLen;
  b.Value(f.value, 2);
  b.Word(".");
  return p;
}

// Training only: dense recall drills. Many facts, each asked about (or, half
// of the time, stated again with its value graded) at a random later point,
// with look-alike distractors.
void MakeRecall(Rng& rng, uint32_t length, Session& s) {
  const uint32_t n_targets =
      std::clamp<uint32_t>(Fit(length, 0.75, kFactLen + kQuestionLen), 1, 24);
  const uint32_t n_distractors = std::min<uint32_t>(rng.Between(0, 8), Fit(length, 0.1, kFactLen));
  std::vector<Fact> facts = DrawFacts(rng, n_targets, n_distractors, /*agentic=*/false);
  s.n_facts = n_targets;
  s.n_distractors = n_distractors;
  rng.Shuffle(facts);
  std::vector<bool> restate(facts.size());
  uint32_t fixed = 1 + static_cast<uint32_t>(facts.size()) * kFactLen;
  for (size_t i = 0; i < facts.size(); ++i) {
    if (!facts[i].target) continue;
    restate[i] = rng.Chance(0.5);
    fixed += restate[i] ? kFactLen : kQuestionLen;
  }
  const uint32_t filler = length - fixed;
  struct Event {
    uint32_t cut;
    int question;  // 0: the fact, 1: its question.
    size_t fact;
  };
  std::vector<Event> events;
  for (size_t i = 0; i < facts.size(); ++i) {
    const uint32_t cut = rng.Between(0, filler * 7 / 10);
    events.push_back({cut, 0, i});
    if (facts[i].target) events.push_back({rng.Between(cut, filler), 1, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.cut != b.cut ? a.cut < b.cut : a.question < b.question;
  });
  Builder b(rng, s);
  b.Token(Vocabulary::kBos);
  std::vector<uint32_t> fact_first(facts.size());
  uint32_t done = 0;
  for (const Event& e : events) {
    b.Filler(e.cut - done, false);
    done = e.cut;
    if (e.question == 0) {
      std::vector<uint32_t> first;
      EmitFact(b, facts[e.fact], false, false, &first);
      fact_first[e.fact] = first[0];
    } else if (restate[e.fact]) {
      s.probes.push_back(EmitRestatement(b, facts[e.fact], fact_first[e.fact]));
    } else {
      s.probes.push_back(EmitQuestion(b, facts[e.fact], false, fact_first[e.fact], kFactLen));
    }
  }
  b.Filler(filler - done, false);
}

// Each of n items stated twice (copy and bind drills): first at a cut in
// the first 70% of the filler, again at a later cut. Sorted by cut, a first
// statement before a repeat at the same cut.
struct Statement {
  uint32_t cut;
  int again;  // 0: the first statement, 1: the repeat.
  size_t item;
};

std::vector<Statement> StatedTwice(Rng& rng, size_t n, uint32_t filler) {
  std::vector<Statement> events;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t cut = rng.Between(0, filler * 7 / 10);
    events.push_back({cut, 0, i});
    events.push_back({rng.Between(cut, filler), 1, i});
  }
  std::sort(events.begin(), events.end(), [](const Statement& a, const Statement& b) {
    return a.cut != b.cut ? a.cut < b.cut : a.again < b.again;
  });
  return events;
}

// Training only: copy drills. Spans of filler (8-24 tokens) that occur
// twice; the second occurrence is graded from its third token on. Every
// graded token teaches the induction pattern (find where the current
// context occurred before and copy what followed), which retrieval builds
// on; no probes.
void MakeCopy(Rng& rng, uint32_t length, Session& s) {
  std::vector<uint32_t> lengths;
  uint32_t fixed = 1;
  const uint32_t most = std::max<uint32_t>(1, length * 3 / 5);
  while (lengths.size() < 24) {
    const uint32_t n = rng.Between(8, 24);
    if (fixed + 2 * n > most) break;
    lengths.push_back(n);
    fixed += 2 * n;
  }
  const uint32_t filler = length - fixed;
  Builder b(rng, s);
  std::vector<std::vector<int32_t>> spans(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) b.FillerTokens(lengths[i], false, &spans[i]);
  const std::vector<Statement> events = StatedTwice(rng, spans.size(), filler);
  b.Token(Vocabulary::kBos);
  uint32_t done = 0;
  for (const Statement& e : events) {
    b.Filler(e.cut - done, false);
    done = e.cut;
    const std::vector<int32_t>& span = spans[e.item];
    for (size_t j = 0; j < span.size(); ++j) b.Token(span[j], e.again && j >= 2 ? 2 : 0);
  }
  b.Filler(filler - done, false);
}

// Training only: bind drills. Facts "[ADJ] NOUN D D D ." (the value right
// after its key), each asked again at a random later point as "? [ADJ] NOUN"
// with its value graded. The "?" marks the repeat: without a marker (a
// repeat written like a first statement) the synthetic check's lookup is
// not learned either (models/README.md). One-word keys are distinct nouns;
// two-word keys include look-alikes (DrawFacts), and every fact is asked
// about, look-alikes too.
void MakeBind(Rng& rng, uint32_t length, bool two_words, Session& s) {
  const Vocabulary& v = GetVocabulary();
  const uint32_t fact_len = two_words ? 6 : 5;
  const uint32_t n = std::clamp<uint32_t>(Fit(length, 0.85, 2 * fact_len), 1, 24);
  const uint32_t n_alike = two_words ? n / 3 : 0;
  std::vector<Fact> facts = DrawFacts(rng, n - n_alike, n_alike, /*agentic=*/false);
  if (!two_words) {
    std::vector<int32_t> nouns = v.key_nouns();
    rng.Shuffle(nouns);
    for (size_t i = 0; i < facts.size(); ++i) facts[i].key.noun = nouns[i];
  }
  s.n_facts = n;
  rng.Shuffle(facts);
  const uint32_t filler = length - 1 - n * (2 * fact_len + 1);
  const std::vector<Statement> events = StatedTwice(rng, facts.size(), filler);
  Builder b(rng, s);
  b.Token(Vocabulary::kBos);
  std::vector<uint32_t> fact_first(facts.size());
  uint32_t done = 0;
  for (const Statement& e : events) {
    b.Filler(e.cut - done, false);
    done = e.cut;
    const Fact& f = facts[e.item];
    const uint8_t key_role = e.again ? 0 : 1;
    if (!e.again) fact_first[e.item] = b.size();
    if (e.again) b.Word("?");
    if (two_words) b.Token(f.key.adjective, key_role);
    b.Token(f.key.noun, key_role);
    if (e.again) {
      Probe p;
      p.answer_first = b.size();
      p.answer.assign(f.value.begin(), f.value.end());
      p.fact_first = fact_first[e.item];
      p.fact_last = p.fact_first + fact_len;
      s.probes.push_back(std::move(p));
    }
    b.Value(f.value, e.again ? 2 : 1);
    b.Word(".");
  }
  b.Filler(filler - done, false);
}

void MakeAgentic(Rng& rng, uint32_t length, Session& s) {
  const uint32_t n_calls = std::clamp<uint32_t>(
      std::min<uint32_t>(rng.Between(3, 6), Fit(length, 0.4, kToolFactLen + kCallLen)), 1, 6);
  const uint32_t n_distractors = std::min<uint32_t>(rng.Between(1, 5), Fit(length, 0.2, kToolFactLen));
  std::vector<Fact> facts = DrawFacts(rng, n_calls, n_distractors, /*agentic=*/true);
  s.n_facts = n_calls;
  s.n_distractors = n_distractors;
  const uint32_t fixed = 1 + static_cast<uint32_t>(facts.size()) * kToolFactLen + n_calls * kCallLen;
  const uint32_t filler = length - fixed;
  rng.Shuffle(facts);
  // Facts in the first 60% of the filler, calls after: each call needs a
  // value given long before it.
  const uint32_t split = filler * 3 / 5;
  const std::vector<uint32_t> fact_cuts = CutPoints(rng, facts.size(), 0, split);
  const std::vector<uint32_t> call_cuts = CutPoints(rng, n_calls, split, filler);
  std::vector<size_t> calls;
  for (size_t i = 0; i < facts.size(); ++i) {
    if (facts[i].target) calls.push_back(i);
  }
  rng.Shuffle(calls);
  Builder b(rng, s);
  b.Token(Vocabulary::kBos);
  std::vector<uint32_t> fact_first;
  uint32_t done = 0;
  for (size_t i = 0; i < facts.size(); ++i) {
    b.Filler(fact_cuts[i] - done, true);
    done = fact_cuts[i];
    EmitFact(b, facts[i], false, true, &fact_first);
  }
  for (size_t c = 0; c < calls.size(); ++c) {
    b.Filler(call_cuts[c] - done, true);
    done = call_cuts[c];
    s.probes.push_back(EmitCall(b, facts[calls[c]], fact_first[calls[c]]));
  }
  b.Filler(filler - done, true);
}

}  // namespace

// ----------------------------------------------------------- vocabulary --

Vocabulary::Vocabulary() {
  for (auto w : {"<unk>", "<s>", "</s>"}) Add(w);
  for (auto w : kStructure) Add(w);
  for (auto w : kDigits) digits_.push_back(Add(w));
  for (auto w : kKeyAdjectives) key_adjectives_.push_back(Add(w));
  for (auto w : kKeyNouns) key_nouns_.push_back(Add(w));
  for (auto w : kDeterminers) determiners.push_back(Add(w));
  for (auto w : kNouns) nouns.push_back(Add(w));
  for (auto w : kVerbs) verbs.push_back(Add(w));
  for (auto w : kAdjectives) adjectives.push_back(Add(w));
  for (auto w : kAdverbs) adverbs.push_back(Add(w));
  for (auto w : kPrepositions) prepositions.push_back(Add(w));
}

int32_t Vocabulary::Add(absl::string_view word) {
  for (const auto& w : words_) {
    if (w == word) {
      std::fprintf(stderr, "evoke::eval vocabulary: duplicate word '%.*s'\n",
                   static_cast<int>(word.size()), word.data());
      std::abort();
    }
  }
  words_.emplace_back(word);
  return static_cast<int32_t>(words_.size() - 1);
}

int32_t Vocabulary::Id(absl::string_view word) const {
  static const auto* index = [this] {
    auto* m = new absl::flat_hash_map<std::string, int32_t>();
    for (size_t i = 0; i < words_.size(); ++i) (*m)[words_[i]] = static_cast<int32_t>(i);
    return m;
  }();
  auto it = index->find(std::string(word));
  if (it == index->end()) {
    std::fprintf(stderr, "evoke::eval vocabulary: no word '%.*s'\n", static_cast<int>(word.size()),
                 word.data());
    std::abort();
  }
  return it->second;
}

std::string Vocabulary::Text(const std::vector<int32_t>& tokens, size_t first, size_t last) const {
  std::string out;
  last = std::min(last, tokens.size());
  for (size_t i = first; i < last; ++i) {
    if (!out.empty()) out += ' ';
    const int32_t t = tokens[i];
    out += (t >= 0 && t < size()) ? words_[static_cast<size_t>(t)] : words_[kUnk];
  }
  return out;
}

const Vocabulary& GetVocabulary() {
  static const Vocabulary* v = new Vocabulary();
  return *v;
}

// ---------------------------------------------------------------- tasks --

absl::string_view TaskKindName(TaskKind kind) {
  switch (kind) {
    case TaskKind::kNiah:
      return "niah";
    case TaskKind::kMultiFact:
      return "multifact";
    case TaskKind::kAgentic:
      return "agentic";
    case TaskKind::kRecall:
      return "recall";
    case TaskKind::kCopy:
      return "copy";
    case TaskKind::kBind1:
      return "bind1";
    case TaskKind::kBind2:
      return "bind2";
  }
  return "?";
}

bool TrainingOnly(TaskKind kind) {
  return kind == TaskKind::kRecall || kind == TaskKind::kCopy || kind == TaskKind::kBind1 ||
         kind == TaskKind::kBind2;
}

absl::StatusOr<TaskKind> ParseTaskKind(absl::string_view name) {
  for (TaskKind k :
       {TaskKind::kNiah, TaskKind::kMultiFact, TaskKind::kAgentic, TaskKind::kRecall,
        TaskKind::kCopy, TaskKind::kBind1, TaskKind::kBind2}) {
    if (name == TaskKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown task '", name,
                   "' (tasks: niah, multifact, agentic, recall, copy, bind1, bind2)"));
}

uint32_t MinSessionLength(TaskKind kind) {
  switch (kind) {
    case TaskKind::kNiah:
      return 1 + kNeedleLen + kNeedleQuestionLen + kMinFiller;
    case TaskKind::kMultiFact:
      return 1 + kFactLen * 2 + kQuestionLen + kMinFiller + 60;
    case TaskKind::kAgentic:
      return 1 + kToolFactLen * 2 + kCallLen + kMinFiller + 70;
    case TaskKind::kRecall:
      return 1 + kFactLen + kQuestionLen + kMinFiller + 40;
    case TaskKind::kCopy:
      return 64;
    case TaskKind::kBind1:
    case TaskKind::kBind2:
      return 32;
  }
  return 0;
}

absl::StatusOr<Session> MakeSession(Split split, TaskKind kind, uint32_t length, uint64_t seed) {
  if (length < MinSessionLength(kind) || length > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("length ", length, " is outside [",
                                                   MinSessionLength(kind), ", ", 1u << 20,
                                                   "] for task ", TaskKindName(kind)));
  }
  Rng rng(SessionSeed(split, kind, length, seed));
  Session s;
  s.kind = kind;
  s.seed = seed;
  s.tokens.reserve(length);
  s.roles.reserve(length);
  if (kind == TaskKind::kAgentic) {
    MakeAgentic(rng, length, s);
  } else if (kind == TaskKind::kRecall) {
    MakeRecall(rng, length, s);
  } else if (kind == TaskKind::kCopy) {
    MakeCopy(rng, length, s);
  } else if (kind == TaskKind::kBind1 || kind == TaskKind::kBind2) {
    MakeBind(rng, length, kind == TaskKind::kBind2, s);
  } else {
    MakeNiahOrMultiFact(rng, length, kind == TaskKind::kNiah, s);
  }
  if (s.tokens.size() != length) {
    return absl::InternalError(absl::StrCat("generator bug: ", s.tokens.size(),
                                            " tokens for length ", length));
  }
  return s;
}

}  // namespace evoke::eval
