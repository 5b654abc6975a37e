// Checkpoint loading, and every malformed-checkpoint case giving a one-line error that names
// the file, tensor or field at fault.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using testing::fixture_model;
using testing::TempDir;

// A private copy of a fixture folder that a test may damage.
fs::path copy_fixture(const TempDir& dir, const std::string& name) {
  fs::path target = dir.path() / name;
  fs::create_directories(target);
  for (const auto& entry : fs::directory_iterator(fixture_model(name))) {
    fs::copy_file(entry.path(), target / entry.path().filename());
  }
  return target;
}

std::string load_error(const fs::path& folder) {
  auto ops = make_cpu_ops();
  try {
    load_model(folder, LoadMode::kMmap, *ops);
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "error is not one line: " << message;
    return message;
  }
  ADD_FAILURE() << "loading " << folder << " succeeded";
  return "";
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(Checkpoint, LoadsSingleFileAndShardedFolders) {
  auto ops = make_cpu_ops();
  EXPECT_NO_THROW(load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops));
  EXPECT_NO_THROW(load_model(fixture_model("demo-code-target"), LoadMode::kRead, *ops));
}

TEST(Checkpoint, KeepsStoredDtypes) {
  TensorStore store(fixture_model("llama-gqa"), LoadMode::kMmap);
  EXPECT_EQ(store.get("model.layers.0.self_attn.q_proj.weight").dtype, DType::kBF16);
  TensorStore f32_store(fixture_model("qwen2-mqa-bias-f32"), LoadMode::kMmap);
  EXPECT_EQ(f32_store.get("model.layers.0.self_attn.q_proj.bias").dtype, DType::kF32);
}

TEST(Checkpoint, TruncatedFileIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  fs::resize_file(folder / "model.safetensors", fs::file_size(folder / "model.safetensors") / 2);
  std::string error = load_error(folder);
  EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("truncated file?"), std::string::npos) << error;
}

TEST(Checkpoint, FileShorterThanHeaderIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  fs::resize_file(folder / "model.safetensors", 5);
  EXPECT_NE(load_error(folder).find("too short for a safetensors header"), std::string::npos);
}

TEST(Checkpoint, MalformedSafetensorsHeaderIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  std::string garbage = "{\"a\": [1, 2";
  uint64_t size = garbage.size();
  std::ofstream out(folder / "model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << garbage;
  out.close();
  std::string error = load_error(folder);
  EXPECT_NE(error.find("model.safetensors: malformed safetensors header"), std::string::npos)
      << error;
}

TEST(Checkpoint, OverflowingShapeIsRejected) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  // 2^32 x 2^32 elements wrap to zero bytes in 64-bit arithmetic; it must not pass as empty.
  std::string header =
      R"({"model.norm.weight": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})";
  uint64_t size = header.size();
  std::ofstream out(folder / "model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << header;
  out.close();
  std::string error = load_error(folder);
  EXPECT_NE(error.find("tensor \"model.norm.weight\" has an impossibly large shape"),
            std::string::npos)
      << error;
}

TEST(Checkpoint, MalformedConfigJsonIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  write_text(folder / "config.json", "{\"architectures\": [\"LlamaForCausalLM\"],");
  std::string error = load_error(folder);
  EXPECT_NE(error.find("config.json: malformed JSON"), std::string::npos) << error;
}

TEST(Checkpoint, MissingTensorIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  std::vector<NamedTensor> kept;
  {
    SafetensorsFile original(fixture_model("llama-gqa") / "model.safetensors", LoadMode::kRead);
    for (const auto& [name, tensor] : original.tensors()) {
      if (name != "model.layers.1.mlp.up_proj.weight") kept.push_back({name, tensor});
    }
    write_safetensors(folder / "model.safetensors", kept);
  }
  std::string error = load_error(folder);
  EXPECT_NE(error.find("missing tensor \"model.layers.1.mlp.up_proj.weight\""), std::string::npos)
      << error;
}

TEST(Checkpoint, WrongShapeNamesTensorAndShapes) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  nlohmann::json config = read_json(folder / "config.json");
  config["intermediate_size"] = 96;
  write_text(folder / "config.json", config.dump());
  std::string error = load_error(folder);
  EXPECT_NE(error.find(
                "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [128, 64] but the config "
                "implies [96, 64]"),
            std::string::npos)
      << error;
}

TEST(Checkpoint, UnknownArchitectureIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  nlohmann::json config = read_json(folder / "config.json");
  config["architectures"] = {"FalconForCausalLM"};
  write_text(folder / "config.json", config.dump());
  std::string error = load_error(folder);
  EXPECT_NE(error.find("unknown architecture \"FalconForCausalLM\""), std::string::npos) << error;
  EXPECT_NE(error.find("LlamaForCausalLM"), std::string::npos)
      << "lists what is supported: " << error;
}

TEST(Checkpoint, MissingAndMistypedFieldsAreNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  nlohmann::json config = read_json(folder / "config.json");
  config.erase("hidden_size");
  write_text(folder / "config.json", config.dump());
  EXPECT_NE(load_error(folder).find("missing field \"hidden_size\""), std::string::npos);
  config["hidden_size"] = "64";
  write_text(folder / "config.json", config.dump());
  EXPECT_NE(
      load_error(folder).find("field \"hidden_size\" must be a positive integer (got \"64\")"),
      std::string::npos);
}

TEST(Checkpoint, ShardMissingFromIndexIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "demo-code-target");
  fs::remove(folder / "model-00002-of-00002.safetensors");
  std::string error = load_error(folder);
  EXPECT_NE(error.find("model-00002-of-00002.safetensors: cannot open"), std::string::npos)
      << error;
}

TEST(Checkpoint, FolderWithoutWeightsIsNamed) {
  TempDir dir;
  fs::path folder = copy_fixture(dir, "llama-gqa");
  fs::remove(folder / "model.safetensors");
  EXPECT_NE(load_error(folder).find("no model.safetensors or model.safetensors.index.json"),
            std::string::npos);
}

TEST(Safetensors, WriteThenReadRoundTrips) {
  TempDir dir;
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  std::vector<uint16_t> halves = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f)};
  write_safetensors(dir.path() / "t.safetensors",
                    {{"a", Tensor::contiguous(values.data(), DType::kF32, {2, 3})},
                     {"b", Tensor::contiguous(halves.data(), DType::kBF16, {2})}},
                    {{"format", "pt"}});
  SafetensorsFile file(dir.path() / "t.safetensors", LoadMode::kMmap);
  const Tensor& a = file.tensors().at("a");
  EXPECT_EQ(a.shape_string(), "[2, 3]");
  EXPECT_EQ(a.as<const float>()[2], 3.25f);
  EXPECT_EQ(bf16_to_f32(file.tensors().at("b").as<const uint16_t>()[1]), -0.5f);
  EXPECT_EQ(file.metadata().at("format"), "pt");
}

}  // namespace
}  // namespace deepinfer
