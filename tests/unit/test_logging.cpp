#include <popart/error.hpp>
#include <popart/logging.hpp>

#include <gtest/gtest.h>

using namespace popart;

TEST(Logging, LevelsParseAsPopartNamesThem) {
  EXPECT_EQ(logging::levelFromString("trace"), logging::Level::Trace);
  EXPECT_EQ(logging::levelFromString("debug"), logging::Level::Debug);
  EXPECT_EQ(logging::levelFromString("info"), logging::Level::Info);
  EXPECT_EQ(logging::levelFromString("warn"), logging::Level::Warn);
  EXPECT_EQ(logging::levelFromString("err"), logging::Level::Err);
  EXPECT_EQ(logging::levelFromString("off"), logging::Level::Off);
  try {
    logging::levelFromString("loud");
    FAIL();
  } catch (const error &e) {
    EXPECT_NE(std::string(e.what()).find("unknown log level 'loud'"), std::string::npos);
  }
}
