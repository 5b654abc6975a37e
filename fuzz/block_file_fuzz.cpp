// A KV block file as read back from a shared disk: any bytes must come out as one of the
// statuses, and only a file whose every check agrees with the caller's expectation as kOk.
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kv/block_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  // What the engine would expect for this path: the seeds hold such a block.
  const BlockFileIdentity identity{1, 2, 3};
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  constexpr size_t kPayload = 16;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  BlockFileContents contents = parse_block_file(bytes, identity, tokens, kPayload);
  if (contents.status == BlockFileStatus::kOk) {
    // A served block is exactly the file's tail and the file is exactly as long as it says.
    if (contents.payload.size() != kPayload || size != 72 + 16 + kPayload ||
        std::memcmp(contents.payload.data(), data + size - kPayload, kPayload) != 0)
      __builtin_trap();
  } else if (!contents.payload.empty()) {
    __builtin_trap();  // nothing is handed out from a rejected file
  }
  return 0;
}
