// A .safetensors file: the 8-byte header length, the JSON header and the data it points into.
// Opened both ways the loader can (read into memory, mapped); every tensor it accepts must lie
// inside the file, which touching its first and last byte checks under ASan.
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "fuzz/fuzz_support.h"
#include "model/safetensors.h"

namespace {

// An anonymous in-memory file holding `size` bytes, so no input touches the disk.
int memory_file(const uint8_t* data, size_t size) {
  int fd = memfd_create("safetensors", 0);
  if (fd < 0) std::abort();
  size_t written = 0;
  while (written < size) {
    ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) std::abort();
    written += static_cast<size_t>(n);
  }
  return fd;
}

void touch_tensors(const deepinfer::SafetensorsFile& file) {
  volatile uint8_t sink = 0;
  for (const auto& [name, tensor] : file.tensors()) {
    size_t bytes = tensor.nbytes();
    if (bytes == 0) continue;
    const auto* first = static_cast<const uint8_t*>(tensor.data);
    sink = sink ^ first[0] ^ first[bytes - 1];
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  int fd = memory_file(data, size);
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  for (LoadMode mode : {LoadMode::kRead, LoadMode::kMmap}) {
    fuzz::expect_clean([&] {
      SafetensorsFile file(path, mode);
      touch_tensors(file);
    });
  }
  close(fd);
  return 0;
}
