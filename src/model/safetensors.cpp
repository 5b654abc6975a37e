#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kMaxHeaderBytes = size_t{100} << 20;

struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) close(fd);
  }
};

void read_fully(int fd, void* destination, size_t bytes, size_t offset, const fs::path& path) {
  auto* cursor = static_cast<char*>(destination);
  while (bytes > 0) {
    ssize_t got = pread(fd, cursor, std::min(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail("{}: read failed: {}", path.string(), std::strerror(errno));
    cursor += got;
    bytes -= static_cast<size_t>(got);
    offset += static_cast<size_t>(got);
  }
}

Tensor parse_tensor_entry(const fs::path& path, const std::string& name, const json& entry,
                          char* data, size_t data_size) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets")) {
    fail("{}: tensor \"{}\" has a malformed header entry", path.string(), name);
  }
  Tensor tensor;
  try {
    tensor.dtype = dtype_from_safetensors(entry.at("dtype").get<std::string>());
  } catch (const json::exception&) {
    fail("{}: tensor \"{}\" has a non-string dtype", path.string(), name);
  } catch (const Error& error) {
    fail("{}: tensor \"{}\": {}", path.string(), name, error.what());
  }
  const json& shape = entry.at("shape");
  const json& offsets = entry.at("data_offsets");
  if (!shape.is_array() || shape.size() > kMaxDims || !offsets.is_array() || offsets.size() != 2) {
    fail("{}: tensor \"{}\" has a malformed shape or data_offsets", path.string(), name);
  }
  tensor.rank = static_cast<int>(shape.size());
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!shape[i].is_number_unsigned())
      fail("{}: tensor \"{}\" has a bad shape", path.string(), name);
    tensor.shape[i] = shape[i].get<int64_t>();
    if (tensor.shape[i] < 0 || __builtin_mul_overflow(count, tensor.shape[i], &count) ||
        count > (int64_t{1} << 48)) {
      fail("{}: tensor \"{}\" has an impossibly large shape", path.string(), name);
    }
  }
  int64_t stride = 1;
  for (int i = tensor.rank - 1; i >= 0; --i) {
    tensor.strides[static_cast<size_t>(i)] = stride;
    stride *= tensor.shape[static_cast<size_t>(i)];
  }
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    fail("{}: tensor \"{}\" has bad data_offsets", path.string(), name);
  }
  auto begin = offsets[0].get<size_t>();
  auto end = offsets[1].get<size_t>();
  size_t expected = static_cast<size_t>(count) * dtype_size(tensor.dtype);
  if (end < begin || end - begin != expected) {
    fail("{}: tensor \"{}\" has data_offsets [{}, {}) but shape {} needs {} bytes", path.string(),
         name, begin, end, tensor.shape_string(), expected);
  }
  if (end > data_size) {
    fail("{}: tensor \"{}\" ends at byte {} but the file has only {} data bytes (truncated file?)",
         path.string(), name, end, data_size);
  }
  tensor.data = data + begin;
  return tensor;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const fs::path& path, LoadMode mode) : path_(path) {
  FileDescriptor file{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat info {};
  if (fstat(file.fd, &info) != 0) fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
  auto file_size = static_cast<size_t>(info.st_size);
  if (file_size < 8)
    fail("{}: file is {} bytes, too short for a safetensors header (truncated file?)",
         path.string(), file_size);
  uint64_t header_size = 0;
  read_fully(file.fd, &header_size, 8, 0, path);
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    fail("{}: header claims {} bytes but the file has {} (truncated or not safetensors)",
         path.string(), header_size, file_size);
  }
  std::string header(header_size, '\0');
  read_fully(file.fd, header.data(), header_size, 8, path);
  json parsed = parse_json_or_discarded<json>(header);
  if (parsed.is_discarded() || !parsed.is_object()) {
    fail("{}: malformed safetensors header (not a JSON object)", path.string());
  }
  size_t data_offset = 8 + header_size;
  size_t data_size = file_size - data_offset;
  char* data = nullptr;
  if (mode == LoadMode::kMmap) {
    mapping_size_ = file_size;
    mapping_ = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, file.fd, 0);
    if (mapping_ == MAP_FAILED) {
      mapping_ = nullptr;
      fail("{}: mmap failed: {}", path.string(), std::strerror(errno));
    }
    data = static_cast<char*>(mapping_) + data_offset;
  } else {
    owned_ = Buffer(data_size);
    read_fully(file.fd, owned_.data(), data_size, data_offset, path);
    data = static_cast<char*>(owned_.data());
  }
  for (auto& [name, entry] : parsed.items()) {
    if (name == "__metadata__") {
      if (entry.is_object()) {
        for (auto& [key, value] : entry.items()) {
          if (value.is_string()) metadata_[key] = value.get<std::string>();
        }
      }
      continue;
    }
    tensors_[name] = parse_tensor_entry(path, name, entry, data, data_size);
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

TensorStore::TensorStore(const fs::path& folder, LoadMode mode) : folder_(folder) {
  fs::path single = folder / "model.safetensors";
  fs::path index_path = folder / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  if (fs::exists(index_path)) {
    std::ifstream stream(index_path);
    std::stringstream text;
    text << stream.rdbuf();
    json index = parse_json_or_discarded<json>(text.str());
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      fail("{}: malformed index (expected a JSON object with \"weight_map\")", index_path.string());
    }
    for (auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string())
        fail("{}: weight_map entry \"{}\" is not a file name", index_path.string(), name);
      tensor_file_[name] = shard.get<std::string>();
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end()) {
        shard_names.push_back(shard.get<std::string>());
      }
    }
  } else if (fs::exists(single)) {
    shard_names.push_back("model.safetensors");
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", folder.string());
  }
  for (const auto& shard : shard_names) {
    if (shard.find('/') != std::string::npos)
      fail("{}: shard name \"{}\" leaves the folder", index_path.string(), shard);
    files_.push_back(std::make_unique<SafetensorsFile>(folder / shard, mode));
    for (const auto& [name, tensor] : files_.back()->tensors()) {
      index_[name] = &tensor;
      tensor_file_[name] = shard;
    }
  }
  for (const auto& [name, shard] : tensor_file_) {
    if (!index_.count(name)) {
      fail("{}: tensor \"{}\" is listed in the index but missing from {}", folder.string(), name,
           shard);
    }
  }
}

const Tensor& TensorStore::get(const std::string& name) const {
  auto found = index_.find(name);
  if (found == index_.end()) fail("{}: missing tensor \"{}\"", folder_.string(), name);
  return *found->second;
}

const Tensor& TensorStore::get(const std::string& name,
                               std::initializer_list<int64_t> shape) const {
  const Tensor& tensor = get(name);
  bool matches = tensor.rank == static_cast<int>(shape.size());
  size_t axis = 0;
  for (int64_t extent : shape) matches = matches && tensor.shape[axis++] == extent;
  if (!matches) {
    Tensor expected = Tensor::contiguous(nullptr, tensor.dtype, shape);
    fail("{}: tensor \"{}\" has shape {} but the config implies {}", folder_.string(), name,
         tensor.shape_string(), expected.shape_string());
  }
  return tensor;
}

void TensorStore::attach_block_scales(int block_rows, int block_cols) {
  for (auto& [name, tensor] : index_) {
    if (tensor->dtype != DType::kF8E4M3) continue;
    // Hugging Face's "<name>_scale_inv", or DeepSeek's own "<prefix>.scale" beside
    // "<prefix>.weight".
    std::string scale_name = name + "_scale_inv";
    auto found = index_.find(scale_name);
    if (found == index_.end() && name.ends_with(".weight")) {
      std::string own = name.substr(0, name.size() - 7) + ".scale";
      if (index_.count(own)) found = index_.find(scale_name = own);
    }
    if (found == index_.end())
      fail("{}: FP8 tensor \"{}\" has no \"{}\"", folder_.string(), name, scale_name);
    const Tensor& scales = *found->second;
    if (tensor->rank != 2) fail("{}: FP8 tensor \"{}\" is not a matrix", folder_.string(), name);
    int64_t rows = (tensor->dim(0) + block_rows - 1) / block_rows;
    int64_t cols = (tensor->dim(1) + block_cols - 1) / block_cols;
    if (scales.rank != 2 || scales.dim(0) != rows || scales.dim(1) != cols) {
      fail("{}: tensor \"{}\" has shape {} but {} blocks of {}x{} need [{}, {}]", folder_.string(),
           scale_name, scales.shape_string(), tensor->shape_string(), block_rows, block_cols, rows,
           cols);
    }
    BlockScales block{nullptr, rows, cols, block_rows, block_cols};
    if (scales.dtype == DType::kF32) {
      block.data = scales.as<const float>();
    } else if (scales.dtype == DType::kBF16) {
      std::vector<float>& widened = widened_scales_.emplace_back(static_cast<size_t>(rows * cols));
      for (size_t i = 0; i < widened.size(); ++i)
        widened[i] = bf16_to_f32(scales.as<const uint16_t>()[i]);
      block.data = widened.data();
    } else {
      fail("{}: tensor \"{}\" has dtype {}; scales must be F32 or BF16", folder_.string(),
           scale_name, dtype_name(scales.dtype));
    }
    Tensor& scaled = scaled_[name] = *tensor;
    scaled.block_scales = &block_scales_.emplace_back(block);
    tensor = &scaled;
  }
}

void TensorStore::place_in(Ops& ops) {
  if (ops.device() == Device::kCpu) return;
  for (auto& [name, tensor] : index_) {
    Tensor copy = *tensor;
    DI_CHECK(copy.is_contiguous(), "{}: tensor \"{}\" is not contiguous", folder_.string(), name);
    BackendMemory memory = ops.allocate_scratch(copy.nbytes());  // overwritten next
    ops.to_backend(memory.get(), tensor->data, copy.nbytes());
    copy.data = memory.get();
    copy.device = ops.device();
    if (tensor->block_scales) {
      BlockScales scales = *tensor->block_scales;
      size_t bytes = sizeof(float) * static_cast<size_t>(scales.rows * scales.cols);
      BackendMemory scale_memory = ops.allocate_scratch(bytes);
      ops.to_backend(scale_memory.get(), scales.data, bytes);
      scales.data = static_cast<const float*>(scale_memory.get());
      copy.block_scales = &block_scales_.emplace_back(scales);
      placed_memory_.push_back(std::move(scale_memory));
    }
    placed_memory_.push_back(std::move(memory));
    tensor = &(placed_[name] = copy);
  }
  ops.synchronize();  // the copies have landed before the files go
  scaled_.clear();
  widened_scales_.clear();
  files_.clear();
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> result;
  for (const auto& entry : index_) result.push_back(entry.first);
  return result;
}

size_t TensorStore::total_bytes() const {
  size_t bytes = 0;
  for (const auto& entry : index_) bytes += entry.second->nbytes();
  return bytes;
}

size_t TensorSpec::nbytes() const {
  size_t count = 1;
  for (int64_t extent : shape) count *= static_cast<size_t>(extent);
  return count * dtype_size(dtype);
}

void write_safetensors_streaming(const fs::path& path, const std::vector<TensorSpec>& specs,
                                 const std::function<void(const TensorSpec&, void*)>& fill,
                                 const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const TensorSpec& spec : specs) {
    header[spec.name] = {{"dtype", std::string(dtype_name(spec.dtype))},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + spec.nbytes()}}};
    offset += spec.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path.string());
  uint64_t header_size = text.size();
  out.write(reinterpret_cast<const char*>(&header_size), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<char> buffer;
  for (const TensorSpec& spec : specs) {
    buffer.resize(spec.nbytes());
    fill(spec, buffer.data());
    out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  }
  out.close();
  if (!out) fail("{}: write failed (disk full?)", path.string());
}

void write_safetensors(const fs::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const NamedTensor*> sorted;
  for (const auto& tensor : tensors) {
    DI_CHECK(tensor.tensor.is_contiguous(), "write_safetensors: \"{}\" is not contiguous",
             tensor.name);
    sorted.push_back(&tensor);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->name < b->name; });
  std::vector<TensorSpec> specs;
  for (const NamedTensor* entry : sorted) {
    const Tensor& t = entry->tensor;
    specs.push_back(
        {entry->name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank)});
  }
  size_t next = 0;
  write_safetensors_streaming(
      path, specs,
      [&](const TensorSpec& spec, void* destination) {
        std::memcpy(destination, sorted[next++]->tensor.data, spec.nbytes());
      },
      metadata);
}

}  // namespace deepinfer
