// Filled in below (work in progress).
#include "gtest/gtest.h"
