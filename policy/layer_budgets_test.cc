#include "policy/layer_budgets.h"

#include <cstdint>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::policy {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint64_t Sum(const std::vector<uint32_t>& v) {
  return std::accumulate(v.begin(), v.end(), uint64_t{0});
}

TEST(ParseBudgetsJson, ParsesGoodJsonAndIgnoresOtherMembers) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<uint32_t> b,
      ParseBudgetsJson(R"({"method": "evolkv", "mean": 2, "source": "x",
                           "budgets": [3, 0, 2, 2147483648]})"));
  EXPECT_THAT(b, ElementsAre(3u, 0u, 2u, 2147483648u));
}

TEST(ParseBudgetsJson, AcceptsTheExpectedLength) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> b,
                       ParseBudgetsJson(R"({"budgets": [1, 2, 3]})", 3));
  EXPECT_THAT(b, ElementsAre(1u, 2u, 3u));
}

TEST(ParseBudgetsJson, RefusesMalformedJson) {
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": [1, 2,)"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
  EXPECT_THAT(ParseBudgetsJson(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
}

TEST(ParseBudgetsJson, RefusesATopLevelThatIsNotAnObject) {
  EXPECT_THAT(ParseBudgetsJson("[1, 2, 3]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top level")));
}

TEST(ParseBudgetsJson, RefusesMissingNonArrayOrEmptyBudgets) {
  EXPECT_THAT(ParseBudgetsJson(R"({"method": "x"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing the \"budgets\"")));
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": 5})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected an array")));
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST(ParseBudgetsJson, RefusesTheWrongLength) {
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": [1, 2, 3]})", 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("3 entries"), HasSubstr("expected 4"))));
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": [1, 2, 3]})", 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("3 entries"), HasSubstr("expected 2"))));
}

TEST(ParseBudgetsJson, RefusesNegativesNamingTheIndex) {
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": [1, 2, -5]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("budgets[2]"), HasSubstr("negative"))));
  EXPECT_THAT(ParseBudgetsJson(R"({"budgets": [-0.5]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("budgets[0]"), HasSubstr("negative"))));
}

TEST(ParseBudgetsJson, RefusesNonIntegersNamingTheIndex) {
  struct Case {
    const char* element;
    const char* says;
  };
  const Case cases[] = {
      {"1.5", "not an integer"},    {"3.0", "not an integer"},
      {"1e3", "not an integer"},    {"\"3\"", "string"},
      {"true", "boolean"},          {"null", "null"},
      {"[1]", "array"},             {"{\"a\": 1}", "object"},
  };
  for (const Case& c : cases) {
    const std::string json = std::string(R"({"budgets": [4, )") + c.element + "]}";
    EXPECT_THAT(ParseBudgetsJson(json),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("budgets[1]"), HasSubstr("not an integer"),
                               HasSubstr(c.says))))
        << json;
  }
}

TEST(ParseBudgetsJson, RefusesHugeValuesNamingTheIndex) {
  for (const char* huge : {"2147483649", "4294967296", "18446744073709551615",
                           "99999999999999999999999", "1e30"}) {
    const std::string json = std::string(R"({"budgets": [4, 4, )") + huge + "]}";
    EXPECT_THAT(ParseBudgetsJson(json),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("budgets[2]"), HasSubstr("above 2^31"))))
        << json;
  }
}

TEST(ReadBudgetsFile, ReadsAFileAndNamesItInErrors) {
  evoke::testing::TempDir dir;
  const std::string good = dir.path() + "/good.json";
  const std::string bad = dir.path() + "/bad.json";
  std::ofstream(good) << BudgetsToJson(std::vector<uint32_t>{7, 8, 9}, "test");
  std::ofstream(bad) << R"({"budgets": [1, "x"]})";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> b, ReadBudgetsFile(good, 3));
  EXPECT_THAT(b, ElementsAre(7u, 8u, 9u));
  EXPECT_THAT(ReadBudgetsFile(bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(bad), HasSubstr("budgets[1]"))));
  EXPECT_THAT(ReadBudgetsFile(dir.path() + "/absent.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent.json")));
}

TEST(BudgetsToJson, WritesMethodMeanAndBudgets) {
  EXPECT_EQ(BudgetsToJson(std::vector<uint32_t>{4, 2}, "evolkv"),
            "{\"method\":\"evolkv\",\"mean\":3,\"budgets\":[4,2]}\n");
  EXPECT_EQ(BudgetsToJson(std::vector<uint32_t>{1, 2}, "x"),
            "{\"method\":\"x\",\"mean\":1.5,\"budgets\":[1,2]}\n");
}

TEST(BudgetsToJson, RoundTripsThroughParseBudgetsJson) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> value(0, uint32_t{1} << 31);
  std::uniform_int_distribution<uint32_t> length(1, 80);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint32_t> b(length(rng));
    for (uint32_t& x : b) x = value(rng);
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> back,
                         ParseBudgetsJson(BudgetsToJson(b, "evolkv"), b.size()));
    EXPECT_EQ(back, b);
  }
}

TEST(UniformBudgets, GivesEveryLayerTheMean) {
  EXPECT_THAT(UniformBudgets(3, 512), ElementsAre(512u, 512u, 512u));
  EXPECT_TRUE(UniformBudgets(0, 512).empty());
}

TEST(PyramidBudgets, SumsToExactlyLTimesMeanAndDecreases) {
  for (uint32_t n : {2u, 3u, 7u, 16u, 32u, 80u}) {
    for (uint32_t mean : {0u, 1u, 5u, 64u, 100u, 1000u, 1024u, 4097u}) {
      for (double beta : {1.0, 2.0, 7.5, 20.0}) {
        std::vector<uint32_t> b = PyramidBudgets(n, mean, beta);
        ASSERT_EQ(b.size(), n);
        EXPECT_EQ(Sum(b), uint64_t{n} * mean) << n << " " << mean << " " << beta;
        for (uint32_t i = 1; i < n; ++i) {
          EXPECT_LE(b[i], b[i - 1]) << "layer " << i;
        }
        const double top = mean / beta;
        const double bottom = 2.0 * mean - top;
        EXPECT_NEAR(b.back(), top, 1.0) << n << " " << mean << " " << beta;
        EXPECT_NEAR(b.front(), bottom, 1.0) << n << " " << mean << " " << beta;
        if (bottom - top >= n - 1) {
          for (uint32_t i = 1; i < n; ++i) EXPECT_LT(b[i], b[i - 1]) << "layer " << i;
        }
      }
    }
  }
}

TEST(PyramidBudgets, DefaultBetaIsTwenty) {
  std::vector<uint32_t> b = PyramidBudgets(32, 1024);
  EXPECT_EQ(b, PyramidBudgets(32, 1024, 20.0));
  EXPECT_NEAR(b.back(), 1024 / 20.0, 1.0);
  EXPECT_NEAR(b.front(), 2048 - 1024 / 20.0, 1.0);
}

TEST(PyramidBudgets, EdgeCases) {
  EXPECT_THAT(PyramidBudgets(1, 77), ElementsAre(77u));
  EXPECT_TRUE(PyramidBudgets(0, 77).empty());
  // beta below 1 or not finite is uniform.
  EXPECT_EQ(PyramidBudgets(5, 10, 0.25), UniformBudgets(5, 10));
  EXPECT_EQ(PyramidBudgets(5, 10, std::nan("")), UniformBudgets(5, 10));
}

TEST(MeanBudget, IsTheMean) {
  EXPECT_DOUBLE_EQ(MeanBudget(std::vector<uint32_t>{1, 2}), 1.5);
  EXPECT_DOUBLE_EQ(MeanBudget(std::vector<uint32_t>{}), 0.0);
  EXPECT_DOUBLE_EQ(MeanBudget(std::vector<uint32_t>{UINT32_MAX, UINT32_MAX}),
                   static_cast<double>(UINT32_MAX));
}

}  // namespace
}  // namespace evoke::policy
