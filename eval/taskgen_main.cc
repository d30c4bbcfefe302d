// evoke-taskgen: writes generated sessions (eval/tasks.h) for training, and
// the vocabulary for the model's GGUF.
//
//                 --first-seed 0 --count 512 --out shard.bin
//                 --first-seed 0 --count 512 --out shard.bin
//   evoke-taskgen --vocab vocab.txt
//   evoke-taskgen --split eval --tasks multifact --length 512 --count 2 --print
//
// Shard format (little-endian): the 8 bytes "EVTKSHD1", u32 count, u32
// length, then count x length u16 tokens, then count x length u8 roles (0
// filler/structure, 1 fact, 2 answer). Sessions cycle through --tasks in
// order: session i has task i % n_tasks and seed first_seed + i.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "eval/tasks.h"

namespace {

using evoke::eval::GetVocabulary;

int Fail(const std::string& message) {
  std::cerr << "evoke-taskgen: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"evoke-taskgen: generated sessions for training and evaluation"};
  std::string split_name = "train";
  std::string tasks_list = "niah,multifact,agentic";
  uint32_t length = 1024;
  uint64_t first_seed = 0;
  uint32_t count = 1;
  std::string out_path;
  std::string vocab_path;
  bool print = false;
  app.add_option("--split", split_name, "train or eval")->check(CLI::IsMember({"train", "eval"}));
  app.add_option("--tasks", tasks_list, "comma-separated: niah, multifact, agentic");
  app.add_option("--length", length, "tokens per session");
  app.add_option("--first-seed", first_seed, "seed of the first session");
  app.add_option("--count", count, "sessions");
  app.add_option("--out", out_path, "shard file to write");
  app.add_option("--vocab", vocab_path, "write the vocabulary, one word a line, and exit");
  app.add_flag("--print", print, "print the sessions as text with their probes");
  CLI11_PARSE(app, argc, argv);

  const auto& vocab = GetVocabulary();
  if (!vocab_path.empty()) {
    std::ofstream f(vocab_path);
    for (const auto& w : vocab.words()) f << w << "\n";
    if (!f.good()) return Fail("cannot write --vocab " + vocab_path);
    return 0;
  }
  std::vector<evoke::eval::TaskKind> kinds;
  for (absl::string_view name : absl::StrSplit(tasks_list, ',', absl::SkipEmpty())) {
    auto kind = evoke::eval::ParseTaskKind(name);
    if (!kind.ok()) return Fail("--tasks: " + std::string(kind.status().message()));
    kinds.push_back(*kind);
  }
  if (kinds.empty()) return Fail("--tasks: no task");
  if (out_path.empty() && !print) return Fail("nothing to do: give --out, --print or --vocab");
  const auto split = split_name == "train" ? evoke::eval::Split::kTrain : evoke::eval::Split::kEval;

  std::vector<uint16_t> tokens;
  std::vector<uint8_t> roles;
  if (!out_path.empty()) {
    tokens.reserve(static_cast<size_t>(count) * length);
    roles.reserve(static_cast<size_t>(count) * length);
  }
  for (uint32_t i = 0; i < count; ++i) {
    auto s = evoke::eval::MakeSession(split, kinds[i % kinds.size()], length, first_seed + i);
    if (!s.ok()) return Fail("--length: " + std::string(s.status().message()));
    if (print) {
      std::cout << "# " << evoke::eval::TaskKindName(s->kind) << " seed " << s->seed << ", "
                << s->tokens.size() << " tokens, " << s->n_facts << " facts, "
                << s->n_distractors << " distractors\n"
                << vocab.Text(s->tokens) << "\n";
      for (const auto& p : s->probes) {
        std::cout << "  probe at " << p.answer_first << ": "
                  << vocab.Text(s->tokens, p.answer_first, p.answer_first + p.answer.size())
                  << "  (fact at " << p.fact_first << ": "
                  << vocab.Text(s->tokens, p.fact_first, p.fact_last) << ")\n";
      }
    }
    if (!out_path.empty()) {
      tokens.insert(tokens.end(), s->tokens.begin(), s->tokens.end());
      roles.insert(roles.end(), s->roles.begin(), s->roles.end());
    }
  }
  if (!out_path.empty()) {
    std::ofstream f(out_path + ".tmp", std::ios::binary);
    f.write("EVTKSHD1", 8);
    f.write(reinterpret_cast<const char*>(&count), 4);
    f.write(reinterpret_cast<const char*>(&length), 4);
    f.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    f.write(reinterpret_cast<const char*>(roles.data()), static_cast<std::streamsize>(roles.size()));
    f.close();
    if (!f.good() || std::rename((out_path + ".tmp").c_str(), out_path.c_str()) != 0) {
      return Fail("cannot write --out " + out_path);
    }
  }
  return 0;
}
