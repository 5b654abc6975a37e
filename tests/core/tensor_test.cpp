#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace deepinfer {
namespace {

bool all_zero(const Buffer& buffer) {
  const auto* bytes = static_cast<const unsigned char*>(buffer.data());
  for (size_t i = 0; i < buffer.size(); ++i)
    if (bytes[i] != 0) return false;
  return true;
}

TEST(Buffer, SmallAndLargeBuffersAreZeroedAndAligned) {
  // Below and above the huge-page size, where storage comes from the heap and from a mapping;
  // the heap one is allocated after a freed, written one of its size, so it cannot pass by
  // reusing fresh memory.
  {
    Buffer dirty(1000);
    std::memset(dirty.data(), 0xab, dirty.size());
  }
  for (size_t bytes : {size_t{1000}, size_t{3} << 20, (size_t{5} << 20) + 17}) {
    Buffer buffer(bytes);
    ASSERT_NE(buffer.data(), nullptr);
    EXPECT_EQ(buffer.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) %
                  (bytes >= (size_t{2} << 20) ? (size_t{2} << 20) : 64),
              0u)
        << bytes;
    EXPECT_TRUE(all_zero(buffer)) << bytes;
    std::memset(buffer.data(), 0x5a, bytes);  // every byte writable
  }
}

TEST(Buffer, MovesKeepTheStorage) {
  Buffer first(size_t{4} << 20);
  static_cast<char*>(first.data())[123] = 7;
  void* storage = first.data();
  Buffer second = std::move(first);
  EXPECT_EQ(second.data(), storage);
  EXPECT_EQ(static_cast<char*>(second.data())[123], 7);
  Buffer empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
}

}  // namespace
}  // namespace deepinfer
