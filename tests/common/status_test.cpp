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

// serve reads the mark to turn a -c it cannot reserve into exit 4; context and notes must keep it.
TEST(Status, OutOfMemoryIsARuntimeFailureThatContextAndNotesKeepMarked) {
  const Status s = Status::out_of_memory("cpu backend: out of memory allocating 8 bytes")
                       .with_context("reserving the sequence's state")
                       .with_note("give less");
  EXPECT_EQ(s.code(), ExitCode::kRuntime);
  EXPECT_TRUE(s.is_out_of_memory());
  EXPECT_EQ(s.message(),
            "reserving the sequence's state: cpu backend: out of memory allocating 8 bytes. give "
            "less");
  EXPECT_FALSE(Status::runtime("out of memory").is_out_of_memory()) << "the mark, not the text";
  EXPECT_FALSE(Status::ok().is_out_of_memory());
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
