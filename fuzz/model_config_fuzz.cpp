// config.json as a checkpoint folder may hold it: any text is a ModelConfig or an Error
// naming the field.
#include "fuzz/fuzz_support.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  fuzz::expect_clean([&] {
    ModelConfig config = parse_model_config(std::string(fuzz::as_text(data, size)), "config.json");
    (void)config;
  });
  return 0;
}
