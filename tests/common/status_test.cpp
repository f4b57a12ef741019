#include <gtest/gtest.h>

#include "common/status.h"

namespace ktier {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return Status::usage("value must be positive");
  return v;
}

Status use_parse(int v, int* out) {
  KTIER_ASSIGN_OR_RETURN(*out, parse_positive(v));
  return Status::ok();
}

TEST(Status, ExitCodesMatchTheDocumentedContract) {
  EXPECT_EQ(Status::ok().exit_code(), 0);
  EXPECT_EQ(Status::runtime("x").exit_code(), 1);
  EXPECT_EQ(Status::usage("x").exit_code(), 2);
  EXPECT_EQ(Status::corrupt("x").exit_code(), 3);
  EXPECT_EQ(Status::budget("x").exit_code(), 4);
}

TEST(Status, ContextIsPrefixedAndCodeKept) {
  const Status s = Status::corrupt("bad header").with_context("shard a.safetensors");
  EXPECT_EQ(s.code(), ExitCode::kCorrupt);
  EXPECT_EQ(s.message(), "shard a.safetensors: bad header");
}

TEST(Result, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(use_parse(5, &out).is_ok());
  EXPECT_EQ(out, 5);
  const Status s = use_parse(-1, &out);
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_EQ(out, 5);
}

}  // namespace
}  // namespace ktier
