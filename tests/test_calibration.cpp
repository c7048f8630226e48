// The non-CLI parts of strata calibrate (moe/calibration.h): corpus split and the budget list.
#include <gtest/gtest.h>

#include "strata/base/error.h"
#include "strata/moe/calibration.h"

namespace strata {
namespace {

std::vector<std::vector<int32_t>> docs_of_sizes(const std::vector<int>& sizes) {
  std::vector<std::vector<int32_t>> d;
  int next = 0;
  for (int n : sizes) {
    d.emplace_back();
    for (int i = 0; i < n; ++i) d.back().push_back(next++);
  }
  return d;
}

TEST(SplitCorpus, ByDocumentKeepsTheLastFilesOut) {
  const auto docs = docs_of_sizes({3, 4, 5, 6, 7});
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  CorpusSplit s = split_corpus(docs, names, 0.2);
  EXPECT_EQ(s.train.names, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(s.heldout.names, (std::vector<std::string>{"e"}));
  EXPECT_EQ(s.train.n_tokens(), 18u);
  EXPECT_EQ(s.heldout.n_tokens(), 7u);
  s = split_corpus(docs, names, 0.01);
  EXPECT_EQ(s.heldout.docs.size(), 1u) << "any positive fraction holds out at least one file";
  s = split_corpus(docs, names, 0.99);
  EXPECT_EQ(s.train.docs.size(), 1u) << "at least one file trains";
  s = split_corpus(docs, names, 0.0);
  EXPECT_EQ(s.train.docs.size(), 5u);
  EXPECT_TRUE(s.heldout.docs.empty());
}

TEST(SplitCorpus, OneDocumentByTokens) {
  const auto docs = docs_of_sizes({10});
  const CorpusSplit s = split_corpus(docs, {"only"}, 0.3);
  ASSERT_EQ(s.train.docs.size(), 1u);
  ASSERT_EQ(s.heldout.docs.size(), 1u);
  EXPECT_EQ(s.train.docs[0], (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(s.heldout.docs[0], (std::vector<int32_t>{7, 8, 9}));
  EXPECT_THROW(split_corpus(docs, {"only"}, 1.0), Error);
  EXPECT_THROW(split_corpus(docs, {"only"}, -0.1), Error);
  EXPECT_THROW(split_corpus(docs_of_sizes({1}), {"tiny"}, 0.3), Error) << "nothing would be held out";
  EXPECT_THROW(split_corpus({}, {}, 0.1), Error);
}

TEST(ParsePercentList, ListsAndErrors) {
  EXPECT_EQ(parse_percent_list("25,50,75", "--budget"), (std::vector<double>{25, 50, 75}));
  EXPECT_EQ(parse_percent_list("12.5%, 100", "--budget"), (std::vector<double>{12.5, 100}));
  for (const char* bad : {"", "25,,50", "25,", "abc", "101", "-1", "5x"})
    EXPECT_THROW(parse_percent_list(bad, "--budget"), Error) << bad;
}

}  // namespace
}  // namespace strata
