#include "gtest/gtest.h"
TEST(LayerBudgetsPlaceholder, Pending) { GTEST_SKIP() << "being written"; }
